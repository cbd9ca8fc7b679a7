"""ModelRunner: owns every device tensor and runs a scheduled step as device programs.

A step = apply block-table and slot updates, run the prefill part (chunks of several requests,
full depth), run the decode part (one row per request, all loops inside the program with the exit
decision on the device, exited rows compacted out so they stop costing compute, then the LM head
and sampling), and read back one small result. Per-request device state lives in slot pools
indexed by the request's slot: the next input token (sampled tokens never leave the device
between steps), sampling and loop parameters, and the block tables of every plane.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from rlt_kernels.norms import rope_cos_sin

from ..cache.layout import KVLayout
from ..engine.exit_policy import (
    GATE_MODES, LOGIT_CRITERIA, STATE_CRITERIA, ExitState, huginn_exit, init_huginn_state, lookahead_head,
    new_exit_state, ouro_exit,
)
from ..engine.scheduler import SchedulerOutput
from .forward_batch import ForwardBatch, KVCacheTensors
from .staging import StaticStaging, upload_arrays

MAX_TOP_LOGPROBS = 20


@dataclass
class StepResult:
    """Host copy of one step's results, rows in submission order (decode rows, then prefill samples)."""

    tokens: np.ndarray  # int64 [R]
    depths: np.ndarray  # int32 [R]
    logprobs: Optional[np.ndarray] = None  # fp32 [R]
    top_ids: Optional[np.ndarray] = None  # int64 [R, N]
    top_logprobs: Optional[np.ndarray] = None  # fp32 [R, N]


@dataclass
class StepHandle:
    """A submitted step: rows (request, generation) and the pending device→host copies."""

    rows: list = field(default_factory=list)  # (request, generation, kind) per result row
    prefills: list = field(default_factory=list)  # (request, generation, chunk) per prefill chunk
    host: Optional[dict] = None
    event: Optional[torch.cuda.Event] = None
    start_event: Optional[torch.cuda.Event] = None  # set when the runner records device time
    num_top: int = 0

    def device_ms(self) -> Optional[float]:
        """Device time of the step (after result()), when recorded."""
        if self.start_event is None or self.event is None:
            return None
        return self.start_event.elapsed_time(self.event)

    def result(self) -> Optional[StepResult]:
        if self.host is None:
            return None
        if self.event is not None:
            self.event.synchronize()
        h = self.host
        return StepResult(
            tokens=h["tokens"].numpy().copy(), depths=h["depths"].numpy().copy(),
            logprobs=h["logprobs"].numpy().copy() if "logprobs" in h else None,
            top_ids=h["top_ids"].numpy().copy() if "top_ids" in h else None,
            top_logprobs=h["top_logprobs"].numpy().copy() if "top_logprobs" in h else None,
        )


class ModelRunner:
    def __init__(self, model, model_config, layout: KVLayout, *, ops, device, dtype, num_slots: int, num_blocks: int,
                 block_size: int, max_model_len: int, max_rows: int, exit_mode: str, criterion_threshold,
                 lookahead_seed: int, copy_finalize: bool = False):
        self.model, self.cfg, self.layout, self.ops = model, model_config, layout, ops
        self.device, self.dtype = torch.device(device), dtype
        self.family = model_config.family
        self.depth = layout.depth
        self.exit_mode = exit_mode
        self.criterion_threshold = criterion_threshold
        self.copy_finalize = copy_finalize
        self.num_slots, self.block_size, self.max_model_len = num_slots, block_size, max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        d = self.device
        self.allocate_kv(num_blocks)
        self.cos_sin = rope_cos_sin(max_model_len, model_config.head_dim, model_config.rope_theta, device=d)
        z = lambda dt: torch.zeros(num_slots, dtype=dt, device=d)  # noqa: E731
        self.slot_token, self.slot_key = z(torch.int64), z(torch.int64)
        self.slot_temperature, self.slot_top_p, self.slot_min_p = z(torch.float32), z(torch.float32), z(torch.float32)
        self.slot_top_k = z(torch.int32)
        self.slot_threshold = z(torch.float32)
        self.slot_min_loops, self.slot_max_loops = z(torch.int32), z(torch.int32)
        self.lookahead_w = (
            lookahead_head(model_config.hidden_size, lookahead_seed, d, dtype) if exit_mode == "random_lookahead" else None
        )
        self.max_rows = max_rows
        self.graphs = None
        self.record_device_time = False
        self.dec_in = StaticStaging(
            {"slots": (torch.int32, max_rows), "positions": (torch.int64, max_rows), "trace": (torch.int32, max_rows),
             "num_rows": (torch.int32, 1)}, d,
        )
        self.loops_executed = 0

    def allocate_kv(self, num_blocks: int) -> None:
        """(Re)allocate the paged pool and clear the tables (before any request runs)."""
        cfg, layout, d = self.cfg, self.layout, self.device
        self.kv = None
        kv_shape = (layout.num_cache_layers, num_blocks, self.block_size, cfg.kv_heads, cfg.head_dim)
        self.kv = KVCacheTensors(
            k=torch.zeros(kv_shape, dtype=self.dtype, device=d),
            v=torch.zeros(kv_shape, dtype=self.dtype, device=d),
            block_tables=torch.full((layout.num_planes, self.num_slots, self.max_blocks_per_seq), -1, dtype=torch.int32, device=d),
            key_depth=torch.zeros((num_blocks, self.block_size), dtype=torch.int32, device=d),
        )

    def enable_graphs(self, mode: str, sizes: list[int]) -> None:
        """Bucketed capture of the decode program (mode "graphs" or "compile"), largest bucket first."""
        from .graphs import DecodeGraphs

        static = [self.kv.k, self.kv.v, self.kv.block_tables, self.kv.key_depth, self.dec_in.dev, self.cos_sin,
                  self.slot_token, self.slot_key, self.slot_temperature, self.slot_top_p, self.slot_min_p,
                  self.slot_top_k, self.slot_threshold, self.slot_min_loops, self.slot_max_loops]
        self.graphs = DecodeGraphs(self.decode_program, lambda: self.dec_in["num_rows"].zero_(),
                                   [s for s in sizes if s <= self.max_rows], mode=mode, static_tensors=static)
        self.graphs.capture_all()

    # ---- persistent state updates ------------------------------------------------------------
    def _apply_updates(self, sched: SchedulerOutput) -> None:
        arrays = {}
        if sched.block_updates:
            arrays["bt"] = np.asarray(sched.block_updates, dtype=np.int64).reshape(-1)
        admitted = sched.admitted
        if admitted:
            arrays["slot"] = np.asarray([r.slot for r in admitted], dtype=np.int64)
            arrays["key"] = np.asarray([r.row_key for r in admitted], dtype=np.int64)
            p = [r.params for r in admitted]
            arrays["temperature"] = np.asarray([x.temperature for x in p], dtype=np.float32)
            arrays["top_p"] = np.asarray([x.top_p for x in p], dtype=np.float32)
            arrays["min_p"] = np.asarray([x.min_p for x in p], dtype=np.float32)
            arrays["top_k"] = np.asarray([x.top_k if x.top_k > 0 else 0 for x in p], dtype=np.int32)
            arrays["threshold"] = np.asarray([x.exit_threshold for x in p], dtype=np.float32)
            arrays["min_loops"] = np.asarray([r.min_loops for r in admitted], dtype=np.int32)
            arrays["max_loops"] = np.asarray([r.depth_limit for r in admitted], dtype=np.int32)
            arrays["token"] = np.asarray([r.output_token_ids[-1] if r.output_token_ids else 0 for r in admitted], dtype=np.int64)
        if not arrays:
            return
        dev = upload_arrays(arrays, self.device)
        if "bt" in dev:
            u = dev["bt"].view(-1, 4)
            self.kv.block_tables[u[:, 0], u[:, 1], u[:, 2]] = u[:, 3].to(torch.int32)
        if admitted:
            s = dev["slot"]
            self.slot_key[s] = dev["key"]
            self.slot_temperature[s] = dev["temperature"]
            self.slot_top_p[s] = dev["top_p"]
            self.slot_min_p[s] = dev["min_p"]
            self.slot_top_k[s] = dev["top_k"]
            self.slot_threshold[s] = dev["threshold"]
            self.slot_min_loops[s] = dev["min_loops"]
            self.slot_max_loops[s] = dev["max_loops"]
            self.slot_token[s] = dev["token"]

    # ---- a step ------------------------------------------------------------------------------
    def execute(self, sched: SchedulerOutput) -> StepHandle:
        """Submit the step's device work; the handle's `result()` waits for the readback."""
        handle = StepHandle()
        if self.record_device_time and self.device.type == "cuda":
            handle.start_event = torch.cuda.Event(enable_timing=True)
            handle.start_event.record()
        self._apply_updates(sched)
        num_top = max([r.params.logprobs or 0 for r in sched.decodes]
                      + [c.request.params.logprobs or 0 for c in sched.prefills if c.sample] + [0])
        want_lp = any(r.params.logprobs is not None for r in sched.decodes) or any(
            c.sample and c.request.params.logprobs is not None for c in sched.prefills)
        handle.num_top = num_top
        parts = []
        if sched.decodes:
            parts.append(self._run_decode(sched, want_lp, num_top))
            handle.rows += [(r, r.generation, "decode") for r in sched.decodes]
        if sched.prefills:
            part = self._run_prefill(sched, want_lp, num_top)
            if part is not None:
                parts.append(part)
            handle.rows += [(c.request, c.request.generation, "prefill") for c in sched.prefills if c.sample]
            handle.prefills = [(c.request, c.request.generation, c) for c in sched.prefills]
        if parts:
            handle.host, handle.event = self._readback(parts, want_lp, timed=handle.start_event is not None)
        return handle

    def _readback(self, parts, want_lp, timed=False):
        names = ["tokens", "depths"] + (["logprobs", "top_ids", "top_logprobs"] if want_lp else [])
        host = {}
        for name in names:
            dev = torch.cat([p[name] for p in parts])
            buf = torch.empty(dev.shape, dtype=dev.dtype, pin_memory=self.device.type == "cuda")
            buf.copy_(dev, non_blocking=True)
            host[name] = buf
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=timed)
            event.record()
        return host, event

    # ---- sampling ----------------------------------------------------------------------------
    def _sample(self, logits, slots, out_positions, want_lp, num_top, active=None):
        ops = self.ops
        idx = slots.long()
        tokens = ops.sample(
            logits, self.slot_temperature[idx], self.slot_top_k[idx], self.slot_top_p[idx], self.slot_min_p[idx],
            self.slot_key[idx], out_positions, active_rows=active,
        )
        res = {"tokens": tokens}
        if want_lp:
            chosen, top_ids, top_lp = ops.compute_logprobs(logits, tokens, num_top)
            res.update(logprobs=chosen, top_ids=top_ids, top_logprobs=top_lp)
        return res

    # ---- prefill -----------------------------------------------------------------------------
    def _run_prefill(self, sched: SchedulerOutput, want_lp: bool, num_top: int):
        chunks = sched.prefills
        tokens, positions, token_slots, limits = [], [], [], []
        seq_slots, seq_lens, qsl = [], [], [0]
        sample_rows = []
        keys, sample_pos = [], []
        for c in chunks:
            n = len(c.token_ids)
            tokens += c.token_ids
            positions += range(c.start, c.start + n)
            token_slots += [c.request.slot] * n
            limits += c.depths
            seq_slots.append(c.request.slot)
            seq_lens.append(c.start + n)
            qsl.append(qsl[-1] + n)
            if c.sample:
                sample_rows.append(qsl[-1] - 1)
                sample_pos.append(c.start + n)
            keys += [c.request.row_key] * n
        limited = any(d < self.depth for d in limits)
        arrays = {
            "tokens": np.asarray(tokens, np.int64), "positions": np.asarray(positions, np.int64),
            "token_slots": np.asarray(token_slots, np.int32), "limits": np.asarray(limits, np.int32),
            "seq_slots": np.asarray(seq_slots, np.int32), "seq_lens": np.asarray(seq_lens, np.int32),
            "qsl": np.asarray(qsl, np.int32), "sample_rows": np.asarray(sample_rows, np.int64),
            "sample_pos": np.asarray(sample_pos, np.int64),
            "sample_slots": np.asarray([c.request.slot for c in chunks if c.sample], np.int32),
            "keys": np.asarray(keys, np.int64),
        }
        dev = upload_arrays(arrays, self.device)
        batch = ForwardBatch(
            ops=self.ops, kv=self.kv, positions=dev["positions"], token_slots=dev["token_slots"],
            seq_slots=dev["seq_slots"], seq_lens=dev["seq_lens"], query_start_loc=dev["qsl"],
            cos_sin=self.cos_sin, rope_style=self.model.rope_style, depth_limit=dev["limits"] if limited else None,
        )
        self._set_key_depth(batch, dev["limits"] - 1)
        if self.family == "ouro":
            h = self.model.embed(dev["tokens"])
            for t in range(self.depth):
                h = self.model.loop(h, batch, t)
            final = h
        else:
            e = self.model.embed(dev["tokens"], batch)
            s = self.model.initial_state(dev["keys"], dev["positions"])
            for t in range(self.depth):
                s_new = self.model.loop(s, e, batch, t)
                s = torch.where((dev["limits"] > t)[:, None], s_new, s) if limited else s_new
            final = self.model.coda(s, batch)
        self.loops_executed += self.depth * len(tokens)
        if not sample_rows:
            return None
        rows = dev["sample_rows"]
        h_s = final.index_select(0, rows)
        logits = self.model.logits(h_s, self.ops)
        slots = dev["sample_slots"]
        res = self._sample(logits, slots, dev["sample_pos"], want_lp, num_top)
        self.slot_token.index_copy_(0, slots.long(), res["tokens"])
        res["depths"] = torch.full((len(sample_rows),), self.depth, dtype=torch.int32, device=self.device)
        return res

    def _set_key_depth(self, batch: ForwardBatch, last_loop: torch.Tensor) -> None:
        """Record each token's last loop in the key-depth table (through its plane-0 slot)."""
        slots0 = batch.slot_mapping(self.layout.boundary() if self.family == "huginn" else self.layout.core(0))
        if self.family == "ouro" and self.layout.core_planes == 1:
            return
        self.ops.scatter_rows(last_loop.to(torch.int32), slots0, self.kv.key_depth.view(-1), active_rows=batch.active)

    # ---- decode ------------------------------------------------------------------------------
    def _run_decode(self, sched: SchedulerOutput, want_lp: bool, num_top: int):
        rows = sched.decodes
        b = len(rows)
        st = self.dec_in
        st.write("slots", np.asarray([r.slot for r in rows], np.int32))
        st.write("positions", np.asarray(sched.decode_positions, np.int64))
        trace = [r.trace_depths[len(r.output_token_ids) + r.inflight_outputs - 1] if r.trace_depths else self.depth
                 for r in rows]
        st.write("trace", np.asarray(trace, np.int32))
        st.write("num_rows", np.asarray([b], np.int32))
        st.upload()
        res = self.graphs.run(b, want_lp, num_top) if self.graphs is not None else None
        if res is None:
            res = self.decode_program(b, want_lp, num_top)
        return {k: v[:b] for k, v in res.items()}

    def decode_program(self, b: int, want_lp: bool, num_top: int) -> dict:
        """All loops of `b` decode rows (static inputs in `dec_in`), LM head and sampling."""
        d = self.device
        slots = self.dec_in["slots"][:b]
        pos = self.dec_in["positions"][:b]
        trace = self.dec_in["trace"][:b]
        active = self.dec_in["num_rows"]
        tok = self.slot_token.index_select(0, slots.long())
        idx = slots.long()
        thr, min_l, max_l = self.slot_threshold[idx], self.slot_min_loops[idx], self.slot_max_loops[idx]
        row_id = torch.arange(b, device=d)
        rows_live = row_id < active
        depth_out = torch.zeros(b, dtype=torch.int32, device=d)
        batch = self._decode_batch(pos, slots, active.clone())
        self._set_key_depth(batch, torch.full((b,), self.depth - 1, dtype=torch.int32, device=d))
        if self.family == "ouro":
            state = self.model.embed(tok)
            final = torch.zeros_like(state)
        else:
            e = self.model.embed(tok, batch)
            state = self.model.initial_state(self.slot_key.index_select(0, idx), pos)
            final = torch.zeros_like(state)
        ex = self._init_exit(b, state)
        cur_active = batch.active
        final_logits = None
        for t in range(self.depth):
            batch = self._decode_batch(pos, slots, cur_active)
            if self.family == "ouro":
                state = self.model.loop(state, batch, t)
                gate = self.model.gate_logits(state, self.ops, cur_active) if self.exit_mode in GATE_MODES else None
                look = None
                if self.exit_mode == "random_lookahead":
                    look = torch.empty((b, 1), dtype=torch.float32, device=d)
                    self.ops.linear(state, self.lookahead_w, out=look, active_rows=cur_active)
                    look = look[:, 0]
                exit_now = ouro_exit(self.exit_mode, t, gate, look, thr, min_l, max_l, trace, ex)
            else:
                state = self.model.loop(state, e, batch, t)
                lp = None
                if self.exit_mode in LOGIT_CRITERIA:
                    logits_t = self.model.logits(self.model.coda(state, batch), self.ops, cur_active)
                    lp = torch.log_softmax(logits_t, dim=1)
                    final_logits = torch.zeros_like(logits_t) if final_logits is None else final_logits
                exit_now = huginn_exit(self.exit_mode, t, self.criterion_threshold, min_l, max_l, trace, ex, state, lp)
            live = torch.arange(b, device=d) < cur_active
            exit_now = exit_now & live
            if t == self.depth - 1:
                exit_now = live
            gone = torch.where(exit_now, row_id, torch.full_like(row_id, -1))
            self.ops.scatter_rows(state, gone, final, active_rows=None)
            if final_logits is not None:
                self.ops.scatter_rows(logits_t, gone, final_logits, active_rows=None)
            depth_out.index_put_((row_id,), torch.where(exit_now, torch.full_like(depth_out, t + 1), depth_out[row_id]))
            if t < self.depth - 1:
                self._record_exit(batch, exit_now, t)
                keep = live & ~exit_now
                order = torch.argsort((~keep).to(torch.int8), stable=True)
                cur_active = keep.sum().to(torch.int32).reshape(1)
                state, pos, slots, row_id = state[order], pos[order], slots[order], row_id[order]
                thr, min_l, max_l, trace = thr[order], min_l[order], max_l[order], trace[order]
                ex = ex.permute(order)
                if self.family == "huginn":
                    e = e[order]
        out_slots = self.dec_in["slots"][:b]
        out_pos = self.dec_in["positions"][:b] + 1
        batch_full = self._decode_batch(self.dec_in["positions"][:b], out_slots, active)
        if self.family == "ouro":
            logits = self.model.logits(final, self.ops, active)
        elif final_logits is not None:
            logits = final_logits
        else:
            logits = self.model.logits(self.model.coda(final, batch_full), self.ops, active)
        res = self._sample(logits, out_slots, out_pos, want_lp, num_top, active)
        live_slots = torch.where(rows_live, out_slots.long(), torch.full_like(out_slots.long(), -1))
        self.ops.scatter_rows(res["tokens"], live_slots, self.slot_token, active_rows=None)
        res["depths"] = depth_out
        return res

    def _decode_batch(self, pos, slots, active) -> ForwardBatch:
        b = pos.shape[0]
        return ForwardBatch(
            ops=self.ops, kv=self.kv, positions=pos, token_slots=slots, seq_slots=slots,
            seq_lens=(pos + 1).to(torch.int32), query_start_loc=torch.arange(b + 1, dtype=torch.int32, device=self.device),
            cos_sin=self.cos_sin, rope_style=self.model.rope_style, active=active,
        )

    def _init_exit(self, b: int, s0) -> ExitState:
        if self.family == "huginn":
            return init_huginn_state(self.exit_mode, b, s0, self.cfg.vocab_size, self.device)
        return new_exit_state(b, self.device)

    def _record_exit(self, batch: ForwardBatch, exit_now: torch.Tensor, t: int) -> None:
        """LAST_EXITED bookkeeping for rows exiting after loop t < D-1."""
        if self.layout.core_planes == 1:
            return
        if self.copy_finalize:
            planes = torch.where(exit_now, torch.full_like(batch.positions, t + self.layout.core_offset),
                                 torch.full_like(batch.positions, -1))
            self.ops.finalize_last_exited(self.kv.k, self.kv.v, self.kv.block_tables, batch.token_slots, batch.positions,
                                          planes, active_rows=batch.active)
            return
        spec = self.layout.boundary() if self.family == "huginn" else self.layout.core(0)
        slots0 = batch.slot_mapping(spec)
        idx = torch.where(exit_now, slots0, torch.full_like(slots0, -1))
        self.ops.scatter_rows(torch.full_like(idx, t, dtype=torch.int32), idx, self.kv.key_depth.view(-1), active_rows=None)
