"""Self-speculative rounds: draft with the first d loops, verify with loops d..D-1, one program.

A round for R requests with k drafts (rows sorted by their own draft count k_r, descending):

1. Draft passes j = 0..k: the pending token y_0 (and then each draft y_j) runs loops 0..d-1 with
   the exit rule; a row that exits inside the draft is final. For j < k the draft head (the LM
   head on the loop-d state; Huginn: coda + head) proposes y_{j+1}: argmax for greedy rows, a
   draw from the processed distribution q_j (Gumbel-max, draft stream) for sampled rows. The
   loop-d states and exit states are parked per (j, request).
   Guided rows (a grammar) draft y_1 under their grammar's mask and y_2.. unmasked; before the
   verify pass the host checks their drafts against the grammar (`verify_masks`, one sync, only
   in rounds that have such rows) and sends the mask of each of their verify rows.
2. Verify pass: the sum(k_r + 1) rows (j, r) continue from their parked loop-d states through
   loops d..D-1, each as its own one-query sequence (its causal context includes the request's
   earlier drafts, whose K/V each loop writes in a launch of its own before its attention reads
   them), with exit and compaction exactly as a decode step. Their final states give the target
   distributions p_j.
3. Fused acceptance (`accept_draft`): greedy prefix match or exact rejection sampling with the
   very q that drew the drafts; commit the accepted drafts plus the correction/bonus token.
   A guided row's verify row j is masked by its grammar after drafts y_1..y_j, so a draft the
   grammar rejects is rejected here (greedy: the masked argmax differs; sampling: p_j(y) = 0) and
   the committed tokens are those of plain guided decoding (greedy) or follow its distribution.
4. The last committed token and position (+ accepted + 1) go to the slot pools on the device;
   rejected positions are simply overwritten by later steps.

Because every kernel is batch invariant, a greedy round commits exactly the tokens (and exit
depths) plain decoding would produce. Drafted tokens follow the exit rule at verification: a
row's exit is evaluated after every loop, in the draft and in the verify pass, as in decode.
"""

from __future__ import annotations

import numpy as np
import torch

from rlt_kernels.sampling import STREAM_ACCEPT, STREAM_DRAFT, philox_uniform

from .graphs import DecodeGraphs, persistent_tensors, run_bucketed
from .model_runner import RowResults
from .staging import StaticStaging, upload_arrays


class SpeculativeRunner:
    """Device side of self-speculative decoding, built on the model runner's row passes."""

    def __init__(self, runner, max_drafts: int, draft_loops: int, synthetic_acceptance=None):
        self.runner, self.k_max, self.d = runner, max_drafts, draft_loops
        self.synthetic = synthetic_acceptance
        r = runner.max_rows
        self.inp = StaticStaging({
            "slots": (torch.int32, r), "num_drafts": (torch.int32, r), "counts": (torch.int32, max_drafts + 1),
            "trace": (torch.int32, r * (max_drafts + 1)), "vj": (torch.int64, r * (max_drafts + 1)),
            "vr": (torch.int64, r * (max_drafts + 1)), "num_verify": (torch.int32, 1), "num_rows": (torch.int32, 1),
        }, runner.device)
        self.graphs = None

    def enable_graphs(self, mode: str, sizes: list[int]) -> None:
        inert = [self.inp["num_rows"], self.inp["num_verify"], self.inp["counts"]]
        static = persistent_tensors(self, self.runner, self.runner.model) if mode == "compile" else []
        self.graphs = DecodeGraphs(self.round_program, inert, [s for s in sizes if s <= self.runner.max_rows], mode=mode,
                                   static_tensors=static)
        self.capture_startup_graphs()

    def capture_startup_graphs(self) -> None:
        # Every draft count the adaptive policy may pick, greedy and sampling, at startup: a round
        # never waits on a capture. (Rounds that ask for logprobs capture on first use, and so do
        # the variants decode captures on first use.)
        for fixed in self.runner.startup_fixed_variants():
            for k in range(self.k_max, 0, -1):
                for sampling in (False, True):
                    self.graphs.capture_all((k, sampling, False, 0, False, fixed))

    # ---- host side ---------------------------------------------------------------------------
    def run_round(self, requests, num_drafts: list[int], trace_depths, k: int, want_lp: bool, num_top: int,
                  processed: bool = False, guided: list[int] = (), guide=None) -> dict:
        """Stage and launch one round. requests are sorted by num_drafts, descending.

        guided: indices (into requests) of the rows whose drafts `guide` checks (see
        `Executor.execute`); such a round runs eagerly, with a host sync before verification."""
        n = len(requests)
        rows = (self.graphs.bucket(n) if self.graphs is not None else None) or n  # the program's rows
        sampling = not all(r.greedy for r in requests)
        inp = self.inp
        inp.write("slots", np.asarray([r.slot for r in requests], np.int32))
        inp.write("num_drafts", np.asarray(num_drafts, np.int32))
        inp.write("counts", np.asarray([sum(1 for x in num_drafts if x >= j) for j in range(k + 1)], np.int32))
        trace = np.zeros((k + 1, rows), np.int32)
        vj, vr = [], []
        for i, kr in enumerate(num_drafts):
            for j in range(kr + 1):
                vj.append(j)
                vr.append(i)
                trace[j, i] = trace_depths[i][j]
        inp.write("trace", trace.reshape(-1))
        inp.write("vj", np.asarray(vj, np.int64))
        inp.write("vr", np.asarray(vr, np.int64))
        inp.write("num_verify", np.asarray([len(vj)], np.int32))
        inp.write("num_rows", np.asarray([n], np.int32))
        inp.upload()
        verify_masks = None
        if guided:
            starts = np.cumsum([0, *[x + 1 for x in num_drafts]])  # each request's first verify row
            verify_masks = lambda drafts: self._verify_masks(requests, num_drafts, starts, guided, guide, drafts)  # noqa: E731
        fixed = self.runner.takes_fixed_path(requests)
        res = run_bucketed(self.graphs, self.round_program, n, (k, sampling, want_lp, num_top, processed, fixed),
                           eager=bool(guided), verify_masks=verify_masks)
        return {key: value[:n] for key, value in res.items()}

    def _verify_masks(self, requests, num_drafts, starts, guided, guide, drafts):
        """Start reading back the guided rows' drafts (drafts: int64 [rows, k + 1], column 0 the
        pending token); the returned function waits for them (the round's one host sync: the
        verify loops queued meanwhile keep the device busy), asks `guide` and returns (verify row
        ids int64 [G], their bitmask rows int32 [G, W]) on the device."""
        dev = self.runner.device
        picked = drafts.index_select(0, torch.as_tensor(guided, dtype=torch.int64, device=dev))
        host = torch.empty(picked.shape, dtype=picked.dtype, pin_memory=dev.type == "cuda")
        host.copy_(picked, non_blocking=True)
        event = None
        if dev.type == "cuda":
            event = torch.cuda.Event()
            event.record()

        def finish():
            if event is not None:
                event.synchronize()
            drafted = {requests[i].key: host[n, 1 : 1 + num_drafts[i]].tolist() for n, i in enumerate(guided)}
            masks = guide(drafted)
            ids = [int(starts[i]) + j for i in guided for j in range(num_drafts[i] + 1)]
            words = np.concatenate([np.asarray(masks[requests[i].key], np.int32) for i in guided])
            up = upload_arrays({"ids": np.asarray(ids, np.int64), "words": words}, dev)
            return up["ids"], up["words"].view(len(ids), -1)

        return finish

    # ---- the round program -------------------------------------------------------------------
    def round_program(self, rows: int, k: int, sampling: bool, want_lp: bool, num_top: int,
                      processed: bool = False, fixed: bool = False, verify_masks=None) -> dict:
        """One speculative round over `rows` (bucket) rows with k drafts; inputs in `self.inp`.

        fixed: no row may exit early (`ModelRunner.run_loops`' fixed path): drafts and verification
        skip the exit rule before the model's last loop, and attention reads no key depths.

        processed: logit processing (`logit_processing.py`) applies to every draft and verify
        distribution, its counts including the round's earlier drafts; the committed tokens are
        counted after acceptance. The guided-decoding masks (`token_mask.py`) apply after it: the
        slot's mask (the token after the committed output) to draft y_1 and to verify rows j = 0;
        verify_masks(drafts)() -> (verify row ids, int32 [G, W] rows) replaces the mask of the
        guided rows' verify rows (eager rounds only). Reported log-probabilities are those of the
        raw logits."""
        run, inp, ops, dev = self.runner, self.inp, self.runner.ops, self.runner.device
        d, depth = self.d, run.depth
        slots = inp["slots"][:rows]
        idx = slots.long()
        active = inp["num_rows"]
        pos0 = run.slot_pos.index_select(0, idx)
        keys = run.slot_key.index_select(0, idx)
        temp, top_k, top_p, min_p = run.sampling_of(idx)
        num_drafts = inp["num_drafts"][:rows]
        tok = run.slot_token.index_select(0, idx)
        drafts = torch.zeros((rows, k + 1), dtype=torch.int64, device=dev)
        drafts[:, 0] = tok
        q = torch.zeros((rows, k, run.cfg.vocab_size), dtype=torch.float32, device=dev) if sampling and k else None
        n_park = (k + 1) * rows
        park_h = park_e = park_ex = None
        park_depth = torch.zeros(n_park, dtype=torch.int32, device=dev)
        for j in range(k + 1):
            count = inp["counts"][j : j + 1]
            rs = run.start_rows(tok, slots, pos0 + j, inp["trace"][j * rows : (j + 1) * rows], count)
            if park_h is None:
                park_h = torch.zeros((n_park, rs.h.shape[1]), dtype=rs.h.dtype, device=dev)
                park_e = torch.zeros_like(park_h) if rs.e is not None else None
                park_ex = rs.ex.empty_like(n_park)
            out = RowResults.empty(rows, rs.h, dev)
            rs = run.run_loops(rs, 0, d, out, fixed)
            live = torch.arange(rows, device=dev) < rs.active
            parked = torch.where(live, rs.row_id, torch.full_like(rs.row_id, -1))
            ops.scatter_rows(rs.h, parked, out.final, active_rows=None)
            base = j * rows
            park_h[base : base + rows] = out.final
            park_depth[base : base + rows] = out.depth
            park_to = torch.where(live, rs.row_id + base, torch.full_like(rs.row_id, -1))
            if park_e is not None:
                ops.scatter_rows(rs.e, park_to, park_e, active_rows=None)
            rs.ex.park(park_to, park_ex, ops.scatter_rows)
            if j < k:
                logits = run.head_logits(out, slots, pos0 + j, count)
                if processed:  # y_{j+1} follows the committed output and drafts y_1..y_j
                    raw = logits
                    logits = run.logit_proc.apply(raw, idx, pos0 + j + 1, drafts[:, 1:], torch.full_like(pos0, j))
                    if j == 0:  # the slot's mask is the grammar's for y_1 only; y_2.. are checked by the host
                        logits = run.token_mask.apply(logits, idx, raw)
                if q is not None:
                    ops.filtered_probs(logits, temp, top_k, top_p, min_p, out=q[:, j], active_rows=count)
                drawn = ops.sample(logits, temp, top_k, top_p, min_p, keys, pos0 + j + 1, stream=STREAM_DRAFT,
                                   active_rows=count)
                tok = torch.where(torch.arange(rows, device=dev) < count, drawn, tok)  # rows done drafting keep a valid id
                drafts[:, j + 1] = tok
        checked = verify_masks(drafts) if verify_masks is not None else None  # the guided drafts' readback starts
        # Verify: rows (j, r) continue from their parked loop-d state.
        nv = rows * (k + 1)
        num_verify = inp["num_verify"]
        vid = torch.arange(nv, device=dev)
        in_use = vid < num_verify
        zero = torch.zeros_like(vid)
        vj = torch.where(in_use, inp["vj"][:nv], zero)  # padding entries may hold stale indices
        vr = torch.where(in_use, inp["vr"][:nv], zero)
        flat = vj * rows + vr
        v_slots, v_pos = slots[vr], pos0[vr] + vj
        v_idx = v_slots.long()
        out_v = RowResults(park_h.index_select(0, flat), park_depth.index_select(0, flat))
        alive = in_use & (out_v.depth == 0)
        rs = run.row_state(
            v_slots, v_pos, vid, inp["trace"].index_select(0, flat), out_v.final.clone(),
            park_e.index_select(0, flat) if park_e is not None else None, park_ex.gather(flat), active,
        ).permute(torch.argsort((~alive).to(torch.int8), stable=True), alive.sum().to(torch.int32).reshape(1))
        run.run_loops(rs, d, depth, out_v, fixed, shared_sequences=True)
        raw_v = logits_v = run.head_logits(out_v, v_slots, v_pos, num_verify, cached=False, shared_sequences=True)
        if processed:  # the token after draft vj follows drafts y_1..y_vj of its request
            words = run.token_mask.mask.index_select(0, v_idx)
            if checked is not None:
                put, guided_words = checked()
                words = words.index_copy(0, put, guided_words)
            logits_v = run.token_mask.apply_rows(run.logit_proc.apply(raw_v, v_idx, v_pos + 1, drafts[vr, 1:], vj), words,
                                                 raw_v)
        # Arrange per request: row `rows` is the sink of padded verify rows.
        put_r = torch.where(in_use, vr, torch.full_like(vr, rows))
        target = torch.full((rows + 1, k + 1), -1, dtype=torch.int64, device=dev)
        target[put_r, vj] = logits_v.argmax(dim=1)
        depths = torch.zeros((rows + 1, k + 1), dtype=torch.int32, device=dev)
        depths[put_r, vj] = out_v.depth
        p = None
        if sampling:
            p_v = ops.filtered_probs(logits_v, temp[vr], top_k[vr], top_p[vr], min_p[vr], active_rows=num_verify)
            p = torch.zeros((rows + 1, k + 1, p_v.shape[1]), dtype=torch.float32, device=dev)
            p[put_r, vj] = p_v
            p = p[:rows]
        greedy = temp <= 0
        if self.synthetic is not None:
            out_tokens, accepted = self._synthetic_accept(drafts, num_drafts, target[:rows], keys, pos0, k)
        else:
            out_tokens, accepted = ops.accept_draft(drafts[:, 1:], num_drafts, target[:rows], p, q, greedy, keys,
                                                    pos0 + 1, active_rows=active)
        live_row = torch.arange(rows, device=dev) < active
        accepted = torch.where(live_row, accepted, torch.zeros_like(accepted))  # padded rows: not written
        last = out_tokens.gather(1, accepted.long()[:, None])[:, 0]
        run.store_next(idx, active, last, pos0 + accepted.long() + 1)
        if processed:
            run.logit_proc.commit(idx, out_tokens, live_row)
        res = {"tokens": out_tokens, "accepted": accepted, "depths": depths[:rows]}
        if want_lp:
            # Padded verify rows and rows past a request's accepted drafts hold -1 or, past the live
            # row count, unwritten memory: every row passes an in-range id (their results are dropped).
            committed = torch.where(in_use & (out_tokens[vr, vj] >= 0), out_tokens[vr, vj], torch.zeros_like(vr))
            chosen, top_ids, top_lp = ops.compute_logprobs(raw_v, committed, num_top)
            lp = torch.zeros((rows + 1, k + 1), dtype=torch.float32, device=dev)
            lp[put_r, vj] = chosen
            ids = torch.zeros((rows + 1, k + 1, num_top), dtype=torch.int64, device=dev)
            ids[put_r, vj] = top_ids
            vals = torch.zeros((rows + 1, k + 1, num_top), dtype=torch.float32, device=dev)
            vals[put_r, vj] = top_lp
            res.update(logprobs=lp[:rows], top_ids=ids[:rows], top_logprobs=vals[:rows])
        return res

    def _synthetic_accept(self, drafts, num_drafts, target, keys, pos0, k):
        """Benchmark aid only: accept each draft with probability `synthetic_acceptance`.

        The committed tokens are then NOT the model's output (a sampled row commits the verify
        pass's argmax, also with no drafts); this measures round mechanics at a chosen acceptance
        rate on random-weight replicas.
        """
        rows = drafts.shape[0]
        if k == 0:
            return target[:, :1].clone(), torch.zeros(rows, dtype=torch.int32, device=drafts.device)
        u = torch.stack([philox_uniform(keys, pos0 + 1 + j, STREAM_ACCEPT, 1)[:, 0] for j in range(k)], dim=1)
        ok = (u < self.synthetic) & (torch.arange(k, device=drafts.device)[None, :] < num_drafts[:, None])
        accepted = ok.to(torch.int32).cumprod(dim=1).sum(dim=1).to(torch.int32)
        steps = torch.arange(k + 1, device=drafts.device)[None, :]
        fill = target.gather(1, accepted.long()[:, None])
        drafted = torch.cat([drafts[:, 1:], fill], dim=1)
        out = torch.where(steps < accepted[:, None], drafted, torch.where(steps == accepted[:, None], fill, -1))
        return out, accepted
