"""Turn the scheduler's output (live Requests) into the plain `StepInput` an executor runs.

The builder also owns the swap ids: a request swapped out gets an id under which its worker(s)
keep the saved K/V; swapping it back in (or aborting it) names that id again.
"""

from __future__ import annotations

import itertools

from ..step import ChunkInput, SeqInput, StepInput
from .request import Request
from .scheduler import SchedulerOutput


class StepBuilder:
    def __init__(self, depth: int):
        self.depth = depth
        self._swap_ids = itertools.count()
        self._swap_free: list[int] = []

    def new_swap_id(self) -> int:
        """A fresh swap id (a request arriving with K/V saved by another engine)."""
        return next(self._swap_ids)

    def forget_swap(self, req: Request) -> None:
        """A swapped-out request ends (aborted): its saved K/V is freed with the next step."""
        if req.swapped is not None and "id" in req.swapped:
            self._swap_free.append(req.swapped.pop("id"))

    def build(self, sched: SchedulerOutput) -> tuple[StepInput, list[Request]]:
        """(the step as plain data, the live requests indexed by the step's keys)."""
        live: list[Request] = []
        keys: dict[int, int] = {}
        admitted = {id(r) for r in sched.admitted}

        def seq(r: Request) -> SeqInput:
            k = keys.get(id(r))
            if k is None:
                keys[id(r)] = k = len(live)
                live.append(r)
            new = id(r) in admitted
            prompt_lps = r.needs_prompt_logprobs
            p = r.params
            # Positional, in SeqInput's field order (binding 19 keywords per row costs twice as much).
            return SeqInput(
                k, r.slot, r.row_key, r.generation, r.min_loops, r.depth_limit,  # key .. depth_limit
                len(r.prompt_token_ids), r.prefill_target,  # num_prompt_tokens, prefill_target
                list(r.prompt_token_ids) if new or prompt_lps else [],  # prompt_token_ids
                list(r.output_token_ids) if new else r.output_token_ids[-1:],  # output_token_ids
                r.min_token_stops if new else [], r.bad_word_ids if new else [],  # min_token_stops, bad_word_ids
                r.processes_logits, r.wants_logprobs, prompt_lps,  # processes_logits .. needs_prompt_logprobs
                p.logprobs or 0, p.prompt_logprobs or 0, p.greedy,  # num_top_logprobs .. greedy
                p if new else None,  # params: admission only
            )

        step = StepInput(num_drafts=list(sched.num_drafts), round_k=sched.round_k,
                         block_updates=list(sched.block_updates), guided_slots=list(sched.guided_slots),
                         guided_masks=sched.guided_masks)
        for i, r in enumerate(sched.decodes):
            step.decodes.append(seq(r))
            step.traces.append(self.trace(r, 1 + (sched.num_drafts[i] if sched.round_k > 0 else 0)))
        step.prefills = [ChunkInput(seq(c.request), c.start, list(c.token_ids), list(c.depths), c.sample)
                         for c in sched.prefills]
        step.admitted = [seq(r) for r in sched.admitted]
        for r, table in sched.swap_out:
            r.swapped["id"] = sid = next(self._swap_ids)
            step.swap_out.append((sid, [tuple(p) for p in table]))
        for r, table in sched.swap_in:
            step.swap_in.append((r.swapped["id"], [tuple(p) for p in table]))
            r.swapped = None
        step.swap_free, self._swap_free = self._swap_free, []
        return step, live

    def trace(self, r: Request, n: int) -> list[int]:
        """Trace depths of a row's next n outputs (the model depth when not replaying a trace)."""
        if not r.trace_depths:
            return [self.depth] * n
        first = len(r.output_token_ids) + r.inflight_outputs - 1
        return [r.trace_depths[min(first + j, len(r.trace_depths) - 1)] for j in range(n)]
