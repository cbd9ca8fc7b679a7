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

from rlt_kernels.fp8 import FP8_DTYPE
from rlt_kernels.norms import rope_cos_sin

from ..cache.layout import KVLayout
from ..models.exit_rules import ExitRule, ExitState, lookahead_head
from ..models.looped import check_looped_model
from ..step import StepInput
from .forward_batch import KV_FP8_SCALE, ForwardBatch, KVCacheTensors
from .graphs import DecodeGraphs, persistent_tensors, run_bucketed
from .logit_processing import LogitProcessing
from .staging import StaticStaging, upload_arrays
from .token_mask import TokenMask


@dataclass
class RowState:
    """Decode rows in their current (compacted) order; rows at or past `active` are done."""

    slots: torch.Tensor  # int32 [B]
    pos: torch.Tensor  # int64 [B]
    row_id: Optional[torch.Tensor]  # int64 [B]: index of the row in its pass's outputs
    thr: Optional[torch.Tensor]  # the rows' exit parameters and exit state (`row_state`); None for rows
    min_l: Optional[torch.Tensor]  # that run every loop in their start order (`run_full_depth`)
    max_l: Optional[torch.Tensor]
    trace: torch.Tensor
    h: torch.Tensor  # [B, hidden]: the loop state (Ouro's normed state / Huginn's recurrent state)
    e: Optional[torch.Tensor]  # [B, hidden]: the loops' per-row input (Huginn's prelude output), or None
    ex: Optional[ExitState]
    active: torch.Tensor  # int32 [1]

    def permute(self, order: torch.Tensor, active: torch.Tensor) -> "RowState":
        pick = lambda t: None if t is None else t.index_select(0, order)  # noqa: E731
        return RowState(pick(self.slots), pick(self.pos), pick(self.row_id), pick(self.thr), pick(self.min_l),
                        pick(self.max_l), pick(self.trace), pick(self.h), pick(self.e), self.ex.permute(order), active)


@dataclass
class RowResults:
    """Per-row results of a pass, indexed by row id: final state, loops run (0 = not finished)."""

    final: torch.Tensor
    depth: torch.Tensor
    logits: Optional[torch.Tensor] = None

    @staticmethod
    def empty(rows: int, like: torch.Tensor, device) -> "RowResults":
        return RowResults(torch.zeros((rows, like.shape[1]), dtype=like.dtype, device=device),
                          torch.zeros(rows, dtype=torch.int32, device=device))


@dataclass
class StepResult:
    """Host copy of one step's results, rows in submission order (decode rows, then prefill samples).

    Each row holds the tokens it committed (one, or up to k + 1 for a speculative round), -1 padded.
    """

    tokens: np.ndarray  # int64 [R, C]
    depths: np.ndarray  # int32 [R, C]
    logprobs: Optional[np.ndarray] = None  # fp32 [R, C]
    top_ids: Optional[np.ndarray] = None  # int64 [R, C, N]
    top_logprobs: Optional[np.ndarray] = None  # fp32 [R, C, N]
    prompt: Optional[dict] = None  # prompt log-probabilities: "logprobs" [P], "top_ids" [P, N], "top_logprobs" [P, N]


@dataclass
class StepHandle:
    """A submitted step: rows (sequence key, generation) and the pending device→host copies.

    Keys are those of the step's `StepInput` (the engine maps them back to its requests)."""

    rows: list = field(default_factory=list)  # (key, generation, kind, drafts) per result row
    round_k: int = 0
    guided: bool = False  # carries a guided row (the host needs its token before the row's next mask)
    prefills: list = field(default_factory=list)  # (key, generation, tokens) per prefill chunk
    # (key, generation, first prompt index, count) per run of prompt log-probability rows, in row order
    prompt_rows: list = field(default_factory=list)
    host: Optional[dict] = None
    event: Optional[torch.cuda.Event] = None
    start_event: Optional[torch.cuda.Event] = None  # set when the runner records device time

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
        prompt = {k[len("prompt_"):]: v.numpy().copy() for k, v in h.items() if k.startswith("prompt_")} or None
        if "tokens" not in h:  # only prompt log-probabilities (prefill chunks that sample nothing)
            return StepResult(tokens=np.zeros((0, 1), np.int64), depths=np.zeros((0, 1), np.int32), prompt=prompt)
        return StepResult(
            tokens=h["tokens"].numpy().copy(), depths=h["depths"].numpy().copy(),
            logprobs=h["logprobs"].numpy().copy() if "logprobs" in h else None,
            top_ids=h["top_ids"].numpy().copy() if "top_ids" in h else None,
            top_logprobs=h["top_logprobs"].numpy().copy() if "top_logprobs" in h else None, prompt=prompt,
        )


class ModelRunner:
    """Runs steps on a looped model through its `LoopedModel` members (models/looped.py), never
    asking which family it is."""

    def __init__(self, model, model_config, layout: KVLayout, *, ops, device, dtype, num_slots: int, num_blocks: int,
                 block_size: int, max_model_len: int, max_rows: int, max_tokens: int, exit_mode: str, criterion_threshold,
                 lookahead_seed: int, prompt_key: int = 0, kv_dtype: Optional[torch.dtype] = None,
                 penalties: bool = True):
        check_looped_model(model)
        self.model, self.cfg, self.layout, self.ops = model, model_config, layout, ops
        # Huginn's initial-state noise key at prompt positions: the same for every request, so a
        # prompt's K/V depends on its tokens only (prefix-cache blocks are shared across requests).
        # Generated positions, also when recomputed after a preemption, use the request's row key.
        self.prompt_key = prompt_key
        self.device, self.dtype = torch.device(device), dtype
        self.kv_dtype = dtype if kv_dtype is None else kv_dtype  # the K/V planes' dtype (FP8 with kv_cache_dtype)
        self.depth = layout.depth
        self.num_slots, self.block_size, self.max_model_len = num_slots, block_size, max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        d = self.device
        self.allocate_kv(num_blocks)
        self.cos_sin = rope_cos_sin(max_model_len, model_config.head_dim, model_config.rope_theta, device=d)
        z = lambda dt: torch.zeros(num_slots, dtype=dt, device=d)  # noqa: E731
        self.slot_token, self.slot_key, self.slot_pos = z(torch.int64), z(torch.int64), z(torch.int64)
        self.slot_temperature, self.slot_top_p, self.slot_min_p = z(torch.float32), z(torch.float32), z(torch.float32)
        self.slot_top_k = z(torch.int32)
        self.slot_threshold = z(torch.float32)
        self.slot_min_loops, self.slot_max_loops = z(torch.int32), z(torch.int32)
        self.slot_exits_early = [True] * num_slots  # host copy: may the slot's row leave before the last loop
        self.logit_proc = LogitProcessing(num_slots, model_config.vocab_size, d, penalties)
        self.token_mask = TokenMask(num_slots, model_config.vocab_size, d)
        self.exit_rule = ExitRule(exit_mode, criterion_threshold, lookahead_head(
            model_config.hidden_size, lookahead_seed, d, dtype) if exit_mode == "random_lookahead" else None)
        self.max_rows = max_rows
        self.graphs = None
        self.prefill_graphs = None
        self.fixed_steps = True  # steps whose rows all run every loop skip the exit rule before the last one
        self.prompt_only_prefills = True  # prefill steps without generated rows skip the decode arithmetic's launch
        self.forward_only_steps = True  # async guided steps submit their forward before their masks exist
        self.spec = None  # SpeculativeRunner when speculative decoding is on
        self.swapped: dict[int, list] = {}  # swap id -> CPU copies (K, V, key depths) of a swapped-out sequence
        self.record_device_time = False
        self.dec_in = StaticStaging(
            {"slots": (torch.int32, max_rows), "trace": (torch.int32, max_rows), "num_rows": (torch.int32, 1)}, d,
        )
        t_max, s_max = max_tokens, max_rows
        self.pre_in = StaticStaging({
            "tokens": (torch.int64, t_max), "positions": (torch.int64, t_max), "token_slots": (torch.int32, t_max),
            "limits": (torch.int32, t_max), "keys": (torch.int64, t_max), "seq_slots": (torch.int32, s_max),
            "seq_lens": (torch.int32, s_max), "decode_from": (torch.int32, s_max), "qsl": (torch.int32, s_max + 1),
            "sample_rows": (torch.int64, s_max),
            "sample_pos": (torch.int64, s_max), "sample_slots": (torch.int32, s_max), "counts": (torch.int32, 3),
            # last: written only by steps with prompt log-probabilities (uploads send the used prefix)
            "prompt_rows": (torch.int64, t_max), "prompt_targets": (torch.int64, t_max),
        }, d)

    def allocate_kv(self, num_blocks: int) -> None:
        """(Re)allocate the paged pool and clear the tables (before any request runs)."""
        cfg, layout, d = self.cfg, self.layout, self.device
        self.kv = None
        kv_heads = self.model.kv_heads  # this rank's K/V heads (all of them without tensor parallelism)
        kv_shape = (layout.num_cache_layers, num_blocks, self.block_size, kv_heads, cfg.head_dim)
        fp8 = self.kv_dtype == FP8_DTYPE
        scales = lambda: torch.full((layout.num_cache_layers, kv_heads), KV_FP8_SCALE, dtype=torch.float32,  # noqa: E731
                                    device=d) if fp8 else None
        self.kv = KVCacheTensors(
            k=torch.zeros(kv_shape, dtype=self.kv_dtype, device=d),
            v=torch.zeros(kv_shape, dtype=self.kv_dtype, device=d),
            block_tables=torch.full((layout.num_planes, self.num_slots, self.max_blocks_per_seq), -1, dtype=torch.int32, device=d),
            key_depth=torch.zeros((num_blocks, self.block_size), dtype=torch.int32, device=d),
            k_scale=scales(), v_scale=scales(),
        )

    def enable_graphs(self, mode: str, sizes: list[int], token_sizes: list[int]) -> None:
        """Bucketed capture (mode "graphs" or "compile") of the decode program at row buckets and of
        the prefill program at token buckets, largest first."""
        static = persistent_tensors(self, self.model) if mode == "compile" else []
        self.graphs = DecodeGraphs(self.decode_program, [self.dec_in["num_rows"]],
                                   [s for s in sizes if s <= self.max_rows], mode=mode, static_tensors=static)
        # Steps whose rows all run every loop take the fixed-depth program (`run_full_depth`); compile mode
        # keeps one program per bucket (each variant is another compilation of the whole model).
        self.fixed_steps = self.forward_only_steps = self.prompt_only_prefills = mode != "compile"
        self.prefill_graphs = DecodeGraphs(self.prefill_program, [self.pre_in["counts"]], token_sizes, mode=mode,
                                           static_tensors=static)
        self.capture_startup_graphs()

    def capture_startup_graphs(self) -> None:
        """Capture the programs every engine with graphs needs from its first step (decode at every
        row bucket, prefill at every token bucket, and the speculative rounds), largest first."""
        for fixed in self.startup_fixed_variants():
            self.graphs.capture_all((False, 0, False, fixed, False))
        self.prefill_graphs.capture_all((False, 0, False, not self.prompt_only_prefills))
        if self.spec is not None and self.spec.graphs is not None:
            self.spec.capture_startup_graphs()

    def drop_graphs(self) -> None:
        """Forget every captured program (sleep mode; `capture_startup_graphs` takes them again) and
        zero the programs' staged inputs, as they are at startup: a capture runs its program on
        them, and the last step's rows would index past a smaller bucket."""
        spec = self.spec
        for graphs in (self.graphs, self.prefill_graphs, spec.graphs if spec is not None else None):
            if graphs is not None:
                graphs.drop()
        for staging in (self.dec_in, self.pre_in, spec.inp if spec is not None else None):
            if staging is not None:
                staging.dev.zero_()

    # ---- swap preemption ----------------------------------------------------------------------
    def _kv_bits(self):
        """The K and V pools, FP8 planes as their bytes (index_copy_ has no float8 kernel on the CPU)."""
        return (t.view(torch.uint8) if t.dtype == FP8_DTYPE else t for t in (self.kv.k, self.kv.v))

    def export_swapped(self, step: StepInput) -> list[list[torch.Tensor]]:
        """Swap out `step.swap_out`'s sequences and hand their saved copies over (K, V, key depths
        per sequence, in order), complete: for a transfer to another engine. Its swap ids are
        negative, apart from the engine's own."""
        self._swap(StepInput(swap_out=step.swap_out))
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return [self.swapped.pop(sid) for sid, _ in step.swap_out]

    def import_swapped(self, swap_id: int, saved: list[torch.Tensor]) -> None:
        """Hold another engine's saved copies (K, V, key depths) under `swap_id` for a later swap-in."""
        self.swapped[swap_id] = saved

    def _swap(self, sched: StepInput) -> None:
        """Copy swapped-out sequences' blocks (every plane and layer, and their key depths) to CPU
        (kept in `swapped` under the swap id), then swapped-in sequences' saved blocks into their
        new blocks, before the step's work."""
        for sid in sched.swap_free:
            self.swapped.pop(sid, None)
        pin = self.device.type == "cuda"

        def block_indices(table):  # every block of every plane; the plane-0 blocks (key depths live there)
            idx = torch.tensor([b for planes in table for b in planes], dtype=torch.int64)
            first = torch.tensor([planes[0] for planes in table], dtype=torch.int64)
            return idx.to(self.device, non_blocking=True), first.to(self.device, non_blocking=True)

        k_bits, v_bits = self._kv_bits()
        for sid, table in sched.swap_out:
            idx, first = block_indices(table)
            saved = []
            for src in (k_bits.index_select(1, idx), v_bits.index_select(1, idx), self.kv.key_depth.index_select(0, first)):
                host = torch.empty(src.shape, dtype=src.dtype, pin_memory=pin)
                host.copy_(src, non_blocking=True)
                saved.append(host)
            self.swapped[sid] = saved
        for sid, table in sched.swap_in:
            k, v, depth = self.swapped.pop(sid)
            idx, first = block_indices(table)
            k_bits.index_copy_(1, idx, k.to(self.device, non_blocking=True))
            v_bits.index_copy_(1, idx, v.to(self.device, non_blocking=True))
            self.kv.key_depth.index_copy_(0, first, depth.to(self.device, non_blocking=True))

    # ---- persistent state updates ------------------------------------------------------------
    def _apply_updates(self, sched: StepInput) -> None:
        self.token_mask.write(sched.admitted, sched.guided_slots, sched.guided_masks)
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
            arrays["pos"] = np.asarray([r.prefill_target for r in admitted], dtype=np.int64)
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
            self.slot_pos[s] = dev["pos"]
            for r in admitted:
                self.slot_exits_early[r.slot] = self.exit_rule.may_exit_early(r.params.exit_threshold, r.depth_limit,
                                                                              self.depth)
        self.logit_proc.admit(admitted)

    # ---- a step ------------------------------------------------------------------------------
    def execute(self, sched: StepInput, guide=None, late_masks=None) -> StepHandle:
        """Submit the step's device work; the handle's `result()` waits for the readback.

        guide: given when the step's round has guided rows that draft (`StepInput.guided_drafting`);
        called once, between drafting and verification (see `SpeculativeRunner.run_round`).
        late_masks: given for a plain decode step whose guided rows' masks are not known yet;
        called once after the decode forward is submitted and before its sampling, it returns
        (slots, int32 [len(slots), ceil(vocab / 32)] CPU bitmasks) to write first."""
        handle = StepHandle()
        if self.record_device_time and self.device.type == "cuda":
            handle.start_event = torch.cuda.Event(enable_timing=True)
            handle.start_event.record()
        self._swap(sched)
        self._apply_updates(sched)
        num_top = max([r.num_top_logprobs for r in sched.decodes]
                      + [c.request.num_top_logprobs for c in sched.prefills if c.sample] + [0])
        want_lp = any(r.wants_logprobs for r in sched.decodes) or any(
            c.sample and c.request.wants_logprobs for c in sched.prefills)
        parts, prompt_part = [], None
        handle.round_k = sched.round_k
        if sched.decodes and sched.round_k > 0:
            order = sorted(range(len(sched.decodes)), key=lambda i: -sched.num_drafts[i])
            reqs = [sched.decodes[i] for i in order]
            drafts = [sched.num_drafts[i] for i in order]
            traces = [sched.traces[i] for i in order]
            processed = any(r.processes_logits for r in reqs)
            checked = set(sched.guided_drafting()) if guide is not None else set()
            guided = [n for n, i in enumerate(order) if i in checked]
            parts.append(self.spec.run_round(reqs, drafts, traces, sched.round_k, want_lp, num_top, processed,
                                             guided, guide))
            handle.rows += [(r.key, r.generation, "decode", k) for r, k in zip(reqs, drafts)]
        elif sched.decodes:
            parts.append(self._run_decode(sched, want_lp, num_top, any(r.processes_logits for r in sched.decodes),
                                          late_masks))
            handle.rows += [(r.key, r.generation, "decode", 0) for r in sched.decodes]
        if sched.prefills:
            processed = any(c.sample and c.request.processes_logits for c in sched.prefills)
            part, prompt_part = self._run_prefill(sched, want_lp, num_top, handle.prompt_rows, processed)
            if part is not None:
                parts.append(part)
            handle.rows += [(c.request.key, c.request.generation, "prefill", 0) for c in sched.prefills if c.sample]
            handle.prefills = [(c.request.key, c.request.generation, len(c.token_ids)) for c in sched.prefills]
        if parts or prompt_part:
            handle.host, handle.event = self._readback(parts, want_lp, prompt_part, timed=handle.start_event is not None)
        return handle

    def _readback(self, parts, want_lp, prompt_part=None, timed=False):
        """Copy every part's per-row results ([n] or [n, C] committed tokens), and the prompt
        log-probabilities (keys prefixed "prompt_"), to pinned memory."""
        names = ["tokens", "depths"] + (["logprobs", "top_ids", "top_logprobs"] if want_lp else []) if parts else []
        host = {}
        for name, dev in (prompt_part or {}).items():
            host["prompt_" + name] = buf = torch.empty(dev.shape, dtype=dev.dtype, pin_memory=self.device.type == "cuda")
            buf.copy_(dev, non_blocking=True)
        width = max([p["tokens"].shape[1] if p["tokens"].dim() == 2 else 1 for p in parts], default=1)
        for name in names:
            pieces = []
            for p in parts:
                t = p[name]
                if p["tokens"].dim() == 1:
                    t = t.unsqueeze(1)
                if t.shape[1] < width:
                    pad = [0, 0] * (t.dim() - 2) + [0, width - t.shape[1]]
                    t = torch.nn.functional.pad(t, pad, value=-1 if name == "tokens" else 0)
                pieces.append(t)
            dev = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
            buf = torch.empty(dev.shape, dtype=dev.dtype, pin_memory=self.device.type == "cuda")
            buf.copy_(dev, non_blocking=True)
            host[name] = buf
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=timed)
            event.record()
        return host, event

    # ---- sampling ----------------------------------------------------------------------------
    def sampling_of(self, idx: torch.Tensor) -> tuple:
        """The sampling parameters of slots idx (int64 [B]): temperature, top_k, top_p, min_p ([B] each)."""
        return self.slot_temperature[idx], self.slot_top_k[idx], self.slot_top_p[idx], self.slot_min_p[idx]

    def _sample(self, logits, idx, out_positions, want_lp, num_top, active, processed: bool):
        """Sample the next tokens of the rows of slots `idx` (int64 [B]), after logit processing and
        the guided-decoding masks when `processed`, which also counts them; reported
        log-probabilities are those of the raw logits."""
        ops = self.ops
        chosen_from = logits
        if processed:
            chosen_from = self.token_mask.apply(self.logit_proc.apply(logits, idx, out_positions), idx, logits)
        tokens = ops.sample(chosen_from, *self.sampling_of(idx), self.slot_key[idx], out_positions, active_rows=active)
        if processed:
            self.logit_proc.commit(idx, tokens[:, None], torch.arange(tokens.shape[0], device=tokens.device) < active)
        res = {"tokens": tokens}
        if want_lp:
            if active is not None:  # rows past the live count hold unwritten token ids
                tokens = torch.where(torch.arange(tokens.shape[0], device=tokens.device) < active, tokens,
                                     torch.zeros_like(tokens))
            chosen, top_ids, top_lp = ops.compute_logprobs(logits, tokens, num_top)
            res.update(logprobs=chosen, top_ids=top_ids, top_logprobs=top_lp)
        return res

    # ---- prefill -----------------------------------------------------------------------------
    def _run_prefill(self, sched: StepInput, want_lp: bool, num_top: int, prompt_runs: list, processed: bool):
        """Stage the step's prefill chunks (padded to a token bucket when graphs exist) and run them.

        Returns (the sampled rows' results or None, the prompt log-probabilities or None); the
        runs of prompt log-probability rows are appended to `prompt_runs` (see StepHandle)."""
        chunks = sched.prefills
        tokens, positions, token_slots, limits, keys = [], [], [], [], []
        seq_slots, seq_lens, decode_from, qsl = [], [], [], [0]
        # Chunks reaching past their prompt recompute generated outputs (after a preemption): only then
        # does the step launch the decode arithmetic beside the tile kernel (compile mode always does:
        # each variant is another compilation).
        generated = not self.prompt_only_prefills
        sample_rows, sample_pos, sample_slots = [], [], []
        prompt_rows, prompt_targets, prompt_top = [], [], 0
        for c in chunks:
            n = len(c.token_ids)
            req = c.request
            if req.needs_prompt_logprobs:  # the state at position q gives the log-probability of token q + 1
                count = min(n, req.num_prompt_tokens - 1 - c.start)
                if count > 0:
                    prompt_runs.append((req.key, req.generation, c.start + 1, count))
                    prompt_rows += range(qsl[-1], qsl[-1] + count)
                    prompt_targets += req.prompt_token_ids[c.start + 1: c.start + 1 + count]
                    prompt_top = max(prompt_top, req.num_prompt_top_logprobs)
            tokens += c.token_ids
            positions += range(c.start, c.start + n)
            token_slots += [c.request.slot] * n
            limits += c.depths
            in_prompt = min(max(c.request.num_prompt_tokens - c.start, 0), n)  # chunk positions inside the prompt
            keys += [self.prompt_key] * in_prompt + [c.request.row_key] * (n - in_prompt)
            generated = generated or in_prompt < n
            seq_slots.append(c.request.slot)
            seq_lens.append(c.start + n)
            decode_from.append(c.request.num_prompt_tokens)
            qsl.append(qsl[-1] + n)
            if c.sample:
                sample_rows.append(qsl[-1] - 1)
                sample_pos.append(c.start + n)
                sample_slots.append(c.request.slot)
        n_tok, n_seq = len(tokens), len(chunks)
        size = (self.prefill_graphs.bucket(n_tok) if self.prefill_graphs is not None else None) or n_tok
        pad_t, pad_s = size - n_tok, self.max_rows - n_seq
        st = self.pre_in
        # Padding tokens: depth limit 0 (no K/V writes, past the live count); padding sequences own
        # no tokens and have seq_len 0; padding sample rows are past the live count.
        st.write("tokens", np.asarray(tokens + [0] * pad_t, np.int64))
        st.write("positions", np.asarray(positions + [0] * pad_t, np.int64))
        st.write("token_slots", np.asarray(token_slots + [0] * pad_t, np.int32))
        st.write("limits", np.asarray(limits + [0] * pad_t, np.int32))
        st.write("keys", np.asarray(keys + [0] * pad_t, np.int64))
        st.write("seq_slots", np.asarray(seq_slots + [0] * pad_s, np.int32))
        st.write("seq_lens", np.asarray(seq_lens + [0] * pad_s, np.int32))
        st.write("decode_from", np.asarray(decode_from + [0] * pad_s, np.int32))
        st.write("qsl", np.asarray(qsl + [n_tok] * pad_s, np.int32))
        pad_r = self.max_rows - len(sample_rows)
        st.write("sample_rows", np.asarray(sample_rows + [0] * pad_r, np.int64))
        st.write("sample_pos", np.asarray(sample_pos + [0] * pad_r, np.int64))
        st.write("sample_slots", np.asarray(sample_slots + [0] * pad_r, np.int32))
        st.write("counts", np.asarray([n_tok, n_seq, len(sample_rows)], np.int32))
        if prompt_rows:
            st.write("prompt_rows", np.asarray(prompt_rows, np.int64))
            st.write("prompt_targets", np.asarray(prompt_targets, np.int64))
        st.upload()
        # Prompt log-probabilities run eagerly.
        res = run_bucketed(self.prefill_graphs, self.prefill_program, n_tok, (want_lp, num_top, processed, generated),
                           eager=bool(prompt_rows), prompt_rows=len(prompt_rows), prompt_top=prompt_top)
        prompt = {k: res.pop(k) for k in list(res) if k.startswith("prompt_")}
        prompt = {k[len("prompt_"):]: v for k, v in prompt.items()} or None
        if not sample_rows:
            return None, prompt
        return {k: v[: len(sample_rows)] for k, v in res.items()}, prompt

    def prefill_program(self, size: int, want_lp: bool, num_top: int, processed: bool = False, generated: bool = True,
                        prompt_rows: int = 0, prompt_top: int = 0) -> dict:
        """All loops of `size` staged prefill tokens (full depth, or a recomputed output's recorded
        depth), then the LM head and sampling for chunks that complete a prompt (inputs in `pre_in`),
        and the log-probabilities of `prompt_rows` staged rows' next prompt tokens with their top
        `prompt_top` (keys "prompt_logprobs" [R] fp32, "prompt_top_ids" [R, N], "prompt_top_logprobs" [R, N]).
        generated=False: no staged token is past its prompt, so attention launches the prompt arithmetic
        alone, and reads no key depths (every prompt token runs every loop)."""
        st = self.pre_in
        counts = st["counts"]
        n_tok, n_seq, n_samples = counts[0:1], counts[1:2], counts[2:3]
        positions, limits = st["positions"][:size], st["limits"][:size]
        batch = ForwardBatch(
            ops=self.ops, kv=self.kv, positions=positions, token_slots=st["token_slots"][:size],
            seq_slots=st["seq_slots"], seq_lens=st["seq_lens"], query_start_loc=st["qsl"],
            cos_sin=self.cos_sin, rope_style=self.model.rope_style, depth_limit=limits, active=n_tok,
            active_seqs=n_seq, decode_from=st["decode_from"] if generated else None, key_depth_reads=generated,
        )
        self._set_key_depth(batch, limits - 1)
        h, e = self.model.start(st["tokens"][:size], batch, st["keys"][:size])
        for t in range(self.depth):
            h = self.model.loop(h, e, batch, t)
            self._finalize_limited(batch, limits, t)
        final = self.model.head_input(h, batch)
        slots = st["sample_slots"]
        idx = slots.long()
        logits = self.model.logits(final.index_select(0, st["sample_rows"]), self.ops, n_samples)
        res = self._sample(logits, idx, st["sample_pos"], want_lp, num_top, n_samples, processed)
        self.store_next(idx, n_samples, res["tokens"])
        res["depths"] = torch.full((slots.shape[0],), self.depth, dtype=torch.int32, device=self.device)
        if prompt_rows:
            res.update(self._prompt_logprobs(final, st["prompt_rows"][:prompt_rows], st["prompt_targets"][:prompt_rows],
                                             prompt_top))
        return res

    PROMPT_LOGPROB_ROWS = 256  # prompt rows per LM-head pass: bounds the fp32 logits to [256, vocab]

    def _prompt_logprobs(self, final: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor, num_top: int) -> dict:
        """Raw log-probabilities (log_softmax of the logits, as for sampled tokens) of `targets` [R]
        at the final states of prefill rows `rows` [R], with the top `num_top`, a window of rows at a time."""
        chosen, top_ids, top_lp = [], [], []
        for a in range(0, rows.shape[0], self.PROMPT_LOGPROB_ROWS):
            window = slice(a, a + self.PROMPT_LOGPROB_ROWS)
            logits = self.model.logits(final.index_select(0, rows[window]), self.ops)
            c, i, v = self.ops.compute_logprobs(logits, targets[window], num_top)
            chosen.append(c)
            top_ids.append(i)
            top_lp.append(v)
        return {"prompt_logprobs": torch.cat(chosen), "prompt_top_ids": torch.cat(top_ids),
                "prompt_top_logprobs": torch.cat(top_lp)}

    def _finalize_limited(self, batch: ForwardBatch, limits: torch.Tensor, t: int) -> None:
        """Copy reads: recomputed outputs whose recorded depth ends at loop t copy their K/V deeper."""
        if self.layout.copy_reads and t < self.depth - 1:
            self._record_exit(batch, limits - 1 == t, t)

    def _set_key_depth(self, batch: ForwardBatch, last_loop: torch.Tensor) -> None:
        """Record each token's last loop in the key-depth table (through its plane-0 slot), for
        layouts whose attention reads it."""
        if not self.layout.use_key_depth_reads:
            return
        slots0 = batch.slot_mapping(self.layout.key_depth_plane())
        self.ops.scatter_rows(last_loop.to(torch.int32), slots0, self.kv.key_depth.view(-1), active_rows=batch.active)

    # ---- decode ------------------------------------------------------------------------------
    def _run_decode(self, sched: StepInput, want_lp: bool, num_top: int, processed: bool, late_masks=None):
        rows = sched.decodes
        b = len(rows)
        st = self.dec_in
        st.write("slots", np.asarray([r.slot for r in rows], np.int32))
        trace = [t[0] for t in sched.traces]
        st.write("trace", np.asarray(trace, np.int32))
        st.write("num_rows", np.asarray([b], np.int32))
        st.upload()
        fixed = self.takes_fixed_path(rows)
        # Compile mode would compile the whole model again for a forward-only variant: masks first there.
        masks_first = late_masks if not self.forward_only_steps else None
        if masks_first is not None:
            self.token_mask.write([], *masks_first())
            late_masks = None
        late = late_masks is not None
        res = run_bucketed(self.graphs, self.decode_program, b, (want_lp, num_top, processed, fixed, late))
        if late:  # the forward is on the device: now the masks, then sampling (eager: a few kernels)
            self.token_mask.write([], *late_masks())
            res = self.decode_sampling(res, want_lp, num_top, processed)
        return {k: v[:b] for k, v in res.items()}

    def decode_program(self, b: int, want_lp: bool, num_top: int, processed: bool = False, fixed: bool = False,
                       late: bool = False) -> dict:
        """All loops of `b` decode rows (static inputs in `dec_in`), LM head and sampling.

        Each row processes its request's pending token (slot_token) at its position (slot_pos);
        the sampled token and the advanced position go back into the slot pools. fixed: no row
        leaves before the last loop (`run_full_depth`). late: stop before sampling, returning the
        logits (fp32 [b, vocab]) and depths for `decode_sampling`.
        """
        slots = self.dec_in["slots"][:b]
        active = self.dec_in["num_rows"]
        idx = slots.long()
        pos = self.slot_pos.index_select(0, idx)
        batch = self._decode_batch(pos, slots, active, key_depth_reads=not fixed, padding_unread=fixed)
        rs = self.start_rows(self.slot_token.index_select(0, idx), slots, pos, self.dec_in["trace"][:b], active, batch,
                             idx=idx, exits=not fixed)
        if fixed:
            out = self.run_full_depth(rs, batch)
        else:
            out = RowResults.empty(b, rs.h, self.device)
            self.run_loops(rs, 0, self.depth, out, False, batch)
        logits = self.head_logits(out, slots, pos, active, padding_unread=fixed)
        if late:
            return {"logits": logits, "depths": out.depth}
        return self._sample_decode_rows(logits, out.depth, slots, idx, pos, active, want_lp, num_top, processed)

    def decode_sampling(self, forward: dict, want_lp: bool, num_top: int, processed: bool) -> dict:
        """The sampling that `decode_program(..., late=True)` left out, on its outputs: the same
        kernels on the same rows, so the same bits."""
        b = forward["logits"].shape[0]
        slots = self.dec_in["slots"][:b]
        idx = slots.long()
        pos = self.slot_pos.index_select(0, idx)
        return self._sample_decode_rows(forward["logits"], forward["depths"], slots, idx, pos, self.dec_in["num_rows"],
                                        want_lp, num_top, processed)

    def _sample_decode_rows(self, logits, depths, slots, idx, pos, active, want_lp, num_top, processed) -> dict:
        """Sample the decode rows' next tokens, store them (and the advanced positions) in the slot
        pools, and return the results with the rows' depths."""
        next_pos = pos + 1
        res = self._sample(logits, idx, next_pos, want_lp, num_top, active, processed)
        self.store_next(idx, active, res["tokens"], next_pos)
        res["depths"] = depths
        return res

    def store_next(self, idx, active, tokens, positions=None) -> None:
        """Write rows' next input token (and its position) into the slot pools of slots `idx`
        (int64 [B]); rows at or past the live count `active` ([1] int32) write nothing."""
        self.ops.scatter_rows(tokens, idx, self.slot_token, active_rows=active)
        if positions is not None:
            self.ops.scatter_rows(positions, idx, self.slot_pos, active_rows=active)

    def start_rows(self, tokens, slots, pos, trace, active, batch: Optional[ForwardBatch] = None, idx=None,
                   exits: bool = True) -> "RowState":
        """Start the rows' loops from their tokens (the model's `start`: Huginn's prelude and
        initial state from the slots' noise keys) and mark them running. batch: the rows'
        ForwardBatch when the caller has one (its slot mappings are then computed once); idx:
        slots as int64 when the caller has them; exits=False: rows for `run_full_depth`, which
        needs no exit parameters, exit state or row ids."""
        idx = slots.long() if idx is None else idx
        b = tokens.shape[0]
        batch = batch if batch is not None else self._decode_batch(pos, slots, active)
        self._set_key_depth(batch, torch.full((b,), self.depth - 1, dtype=torch.int32, device=self.device))
        keys = self.slot_key.index_select(0, idx) if self.model.random_initial_state else None
        h, e = self.model.start(tokens, batch, keys)
        if not exits:
            return RowState(slots, pos, None, None, None, None, trace, h, e, None, active)
        return self.row_state(slots, pos, torch.arange(b, device=self.device), trace, h, e,
                              self.model.new_exit_state(self.exit_rule.mode, h), active, idx)

    def row_state(self, slots, pos, row_id, trace, h, e, ex, active, idx=None) -> "RowState":
        """Rows of slots `slots` (int32 [B]; idx: the same as int64 when the caller has them) with
        their slots' exit parameters (threshold, min and max loops) and the given loop state (see
        RowState)."""
        idx = slots.long() if idx is None else idx
        return RowState(slots=slots, pos=pos, row_id=row_id, thr=self.slot_threshold[idx],
                        min_l=self.slot_min_loops[idx], max_l=self.slot_max_loops[idx], trace=trace, h=h, e=e, ex=ex,
                        active=active)

    def takes_fixed_path(self, rows) -> bool:
        """Whether a pass over `rows` (objects with a `.slot`) may take `run_full_depth`:
        fixed-path programs are on and none of the rows' requests may exit early."""
        return self.fixed_steps and not any(self.slot_exits_early[r.slot] for r in rows)

    def startup_fixed_variants(self) -> tuple:
        """The `fixed` values whose step programs are captured at startup: the fixed path where it is
        on, and the full path unless the exit rule is fixed depth (rows then leave early only under a
        loop cap below the depth, and that variant is captured on first use)."""
        if not self.fixed_steps:
            return (False,)
        return (True,) if self.exit_rule.mode == "fixed" else (True, False)

    def run_full_depth(self, rs: "RowState", batch: ForwardBatch) -> "RowResults":
        """Every loop of rows none of which may leave before the last (`run_loops`' fixed path),
        for a pass whose output row i is row i: the final states are the last loop's output as it
        stands and every depth is the model's, so no exit bookkeeping runs (row ids, exit
        parameters, scatters into the results). Rows past the live count hold unwritten states."""
        for t in range(self.depth):
            rs.h = self.model.loop(rs.h, rs.e, batch, t)
        return RowResults(rs.h, torch.full((rs.h.shape[0],), self.depth, dtype=torch.int32, device=self.device))

    def run_loops(self, rs: "RowState", t_begin: int, t_end: int, out: "RowResults", fixed: bool = False,
                  batch: Optional[ForwardBatch] = None, shared_sequences: bool = False) -> "RowState":
        """Loops t_begin..t_end-1 with the exit rule after each; exited rows store their final state
        and depth in `out` (by row id) and are compacted out so they cost no more compute. At the
        model's last loop every live row exits. Returns the rows still running.

        fixed: the caller knows no row can leave before the last loop (`ExitRule.may_exit_early`),
        so the rule does not run and rows are compacted only there: the rows' order, states and
        results are those of the full path, which would keep every row until then (and the loops
        share one ForwardBatch, with its slot mappings; `batch` when given, built with
        key_depth_reads=False). Nor did any earlier token of those rows' requests leave early (the
        rule is a request's for its whole life), so attention reads no key depths. A rule that may
        not exit early never hands back head logits (only Huginn's logit criteria do, and they may).
        shared_sequences: rows of one request read each other's keys (`_decode_batch`)."""
        d = self.device
        b = rs.h.shape[0]
        batch = batch if fixed else None
        for t in range(t_begin, t_end):
            if batch is None or not fixed:
                batch = self._decode_batch(rs.pos, rs.slots, rs.active, key_depth_reads=not fixed,
                                           shared_sequences=shared_sequences)
            rs.h = self.model.loop(rs.h, rs.e, batch, t)
            if fixed and t < self.depth - 1:
                continue
            live = torch.arange(b, device=d) < rs.active
            if fixed:  # every row leaves at the last loop, whatever the rule would say
                exit_now, logits_t = live, None
            else:
                exit_now, logits_t = self.model.exit_decision(self.exit_rule, t, rs.h, batch, rs)
                exit_now = (exit_now | (t == self.depth - 1)) & live
            gone = torch.where(exit_now, rs.row_id, torch.full_like(rs.row_id, -1))
            self.ops.scatter_rows(rs.h, gone, out.final, active_rows=None)
            if logits_t is not None:
                if out.logits is None:
                    out.logits = torch.zeros((out.final.shape[0], logits_t.shape[1]), dtype=logits_t.dtype, device=d)
                self.ops.scatter_rows(logits_t, gone, out.logits, active_rows=None)
            self.ops.scatter_rows(torch.full_like(gone, t + 1, dtype=torch.int32), gone, out.depth, active_rows=None)
            if t == self.depth - 1:
                break
            self._record_exit(batch, exit_now, t)
            keep = live & ~exit_now
            rs = rs.permute(torch.argsort((~keep).to(torch.int8), stable=True), keep.sum().to(torch.int32).reshape(1))
        return rs

    def head_logits(self, out: "RowResults", slots, pos, active, cached: bool = True,
                    padding_unread: bool = False, shared_sequences: bool = False) -> torch.Tensor:
        """fp32 logits of the rows' final states (the model's `head_input`, then the head; Huginn's
        coda writes its K/V).

        cached: reuse logits the exit rule already computed at each row's exit (Huginn's logit criteria).
        padding_unread, shared_sequences: as in `_decode_batch`."""
        if cached and out.logits is not None:
            return out.logits
        batch = self._decode_batch(pos, slots, active, padding_unread=padding_unread,
                                   shared_sequences=shared_sequences) if self.model.head_input_attends else None
        return self.model.logits(self.model.head_input(out.final, batch), self.ops, None if padding_unread else active)

    def _decode_batch(self, pos, slots, active, key_depth_reads: bool = True, padding_unread: bool = False,
                      shared_sequences: bool = False) -> ForwardBatch:
        """The pass of decode rows, each its own one-query sequence over its slot's block tables.
        padding_unread: a fixed-depth pass, whose rows past `active` (a bucket's padding) nothing
        reads, so its dense kernels need not read the count. shared_sequences: several rows hold one
        request's slot and read the keys the others write in the same pass (a speculative round's
        verify rows): each loop then writes every row's K/V in a launch of its own before its
        attention reads them. A fused launch (`rope_paged_attention`) orders a program's own K/V
        write before its reads, but nothing orders another program's write before them."""
        b = pos.shape[0]
        return ForwardBatch(
            ops=self.ops, kv=self.kv, positions=pos, token_slots=slots, seq_slots=slots,
            seq_lens=(pos + 1).to(torch.int32), query_start_loc=torch.arange(b + 1, dtype=torch.int32, device=self.device),
            cos_sin=self.cos_sin, rope_style=self.model.rope_style, active=active, decode_from=0,
            key_depth_reads=key_depth_reads, one_query_per_sequence=not shared_sequences, padding_unread=padding_unread,
        )

    def _record_exit(self, batch: ForwardBatch, exit_now: torch.Tensor, t: int) -> None:
        """LAST_EXITED bookkeeping for rows exiting after loop t < D-1."""
        if self.layout.core_planes == 1:
            return
        if self.layout.copy_reads:
            planes = torch.where(exit_now, torch.full_like(batch.positions, t + self.layout.core_offset),
                                 torch.full_like(batch.positions, -1))
            self.ops.finalize_last_exited(self.kv.k, self.kv.v, self.kv.block_tables, batch.token_slots, batch.positions,
                                          planes, active_rows=batch.active)
            return
        slots0 = batch.slot_mapping(self.layout.key_depth_plane())
        idx = torch.where(exit_now, slots0, torch.full_like(slots0, -1))
        self.ops.scatter_rows(torch.full_like(idx, t, dtype=torch.int32), idx, self.kv.key_depth.view(-1), active_rows=None)
