"""Continuous-batching scheduler (plain Python, no torch).

Every step carries all decoding requests (one row each) plus prefill chunks that fill the
remaining token budget (`max_num_batched_tokens`), within `max_num_seqs` running requests.
Prefill chunks are capped per request (`prefill_chunk_size`) and the order of prefilling requests
rotates each step so concurrent long prompts progress together. Layouts whose loops share planes
prefill one position per request per step. With chunked prefill disabled, whole prompts run in
prefill-only steps that take priority over decode for at most `max_consecutive_prefill_steps`
steps in a row.

Admission scans at most `admission_scan_limit` waiting requests in policy order (FCFS: arrival;
priority: lower value first, then arrival). A request that cannot be admitted counts each later
request admitted ahead of it; once it has been bypassed `max_admission_bypasses` times nobody may
pass it. Under memory pressure the scheduler preempts (recompute: free the blocks, re-queue; the
request later re-prefills its prompt and outputs at their recorded depths, so no token and no
output changes): the victim is the lowest-priority, latest-arriving running request. With
`enable_preemption=False` nothing is ever preempted: admission reserves every block a request can
grow to (`lifetime_blocks`) on top of what running requests may still claim, and a request that
does not fit waits.

Only full blocks of a prompt are ever shared (prefix cache, and the n samples of one request): their
K/V is a function of the tokens alone. Blocks at generated positions depend on the request (its exit
depths; Huginn's per-request initial-state noise) and are never looked up. A sample whose sibling is
still computing the prompt's full blocks waits for them and then takes them from the cache.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Optional

from ..cache.kv_cache import KVCacheManager
from ..stable_hash import stable_hash
from .request import Request, Status


@dataclass
class PrefillChunk:
    """Prompt (or recompute) tokens [start, start + len(token_ids)) of one request."""

    request: Request
    start: int
    token_ids: list[int]
    depths: list[int]  # loops each token runs (full depth, or the recorded depth of a recomputed output)
    sample: bool  # the chunk completes a fresh prompt: sample the first output token


@dataclass
class SchedulerOutput:
    decodes: list[Request] = field(default_factory=list)
    num_drafts: list[int] = field(default_factory=list)  # per decode row (speculative rounds)
    round_k: int = 0  # drafts of this step's speculative round (0: plain decode)
    prefills: list[PrefillChunk] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)  # got a slot this step (runner initialises it)
    preempted: list[Request] = field(default_factory=list)
    block_updates: list[tuple[int, int, int, int]] = field(default_factory=list)
    swap_out: list = field(default_factory=list)  # (request, its per-logical-block plane tuples) to copy to CPU
    swap_in: list = field(default_factory=list)  # (request, new plane tuples) to copy back from CPU
    guided_slots: list[int] = field(default_factory=list)  # slots of the step's guided rows (set by the engine)
    guided_masks: object = None  # their next-token bitmasks, int32 [len(guided_slots), ceil(vocab / 32)] (CPU)

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(self.num_drafts) + sum(len(c.token_ids) for c in self.prefills)

    @property
    def is_empty(self) -> bool:
        """Nothing for the runner: no rows, and no state to set up (new slots, block-table
        updates, swaps) — a step that only swaps a request back in must still run its copies."""
        return not (self.decodes or self.prefills or self.admitted or self.block_updates or self.swap_out
                    or self.swap_in)


class Scheduler:
    def __init__(self, cfg, kv: KVCacheManager, *, depth: int, shares_planes: bool, num_slots: int):
        self.cfg = cfg
        self.kv = kv
        self.depth = depth
        self.shares_planes = shares_planes
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self._rotation = 0
        self._consecutive_prefill_steps = 0
        self.num_preemptions = 0
        self.draft_policy = None  # DraftPolicy when speculative decoding is on
        self.greedy_rounds = None  # GreedyRounds with the adaptive policy: the greedy rows' count per round
        # Prefill role of disaggregated prefill: requests stop after their first token (no decode rows)
        # until engine/kv_transfer.py hands them to the decode engine.
        self.hold_decodes = False

    # ---- queue management ----------------------------------------------------------------------
    def _order_key(self, r: Request):
        if self.cfg.scheduling_policy == "priority":
            return (r.params.priority, r.arrival_index, r.sample_index)
        return (r.arrival_index, r.sample_index)

    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        bisect.insort(self.waiting, request, key=self._order_key)

    def finish(self, request: Request) -> None:
        """Release a finished or aborted request's slot and blocks."""
        if request in self.running:
            self.running.remove(request)
            self._release(request)
        elif request in self.waiting:
            self.waiting.remove(request)
            self.kv.free(request.request_id)
        request.status = Status.FINISHED
        request.generation += 1

    def _release(self, request: Request) -> None:
        self.kv.free(request.request_id)
        if request.slot is not None:
            self.free_slots.append(request.slot)
            request.slot = None

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- preemption ----------------------------------------------------------------------------
    def _victim(self, out: SchedulerOutput, exclude: Request) -> Optional[Request]:
        candidates = [r for r in self.running if r is not exclude]
        if not candidates or not self.cfg.enable_preemption:
            return None
        return max(candidates, key=self._order_key)

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        if victim in out.decodes:
            i = out.decodes.index(victim)
            del out.decodes[i], out.num_drafts[i]
        out.prefills = [c for c in out.prefills if c.request is not victim]
        if victim in out.admitted:
            out.admitted.remove(victim)
        self.running.remove(victim)
        if self.cfg.preemption_mode == "swap" and victim.num_computed > 0:
            # Swap: the runner copies these blocks to CPU before this step's device work (which may
            # already reuse them); re-admission copies them back instead of recomputing.
            keep = self.kv.blocks_for(victim.num_computed)
            out.swap_out.append((victim, list(self.kv.table(victim.request_id))[:keep]))
            victim.swapped = {"num_computed": victim.num_computed}
        self._release(victim)
        victim.num_computed = 0
        victim.num_inflight = 0
        victim.inflight_outputs = 0
        victim.generation += 1
        victim.metrics.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(victim)
        self.add(victim)

    def _allocate(self, r: Request, num_tokens: int, out: SchedulerOutput) -> bool:
        """Grow r to num_tokens positions, preempting lower-ranked requests if needed."""
        while not self.kv.allocate(r.request_id, r.slot, num_tokens):
            if not self.cfg.enable_preemption:
                # Admission reserved the request's whole lifetime, so this cannot happen.
                raise AssertionError(f"{r.request_id}: KV blocks reserved at admission are missing")
            victim = self._victim(out, exclude=r)
            if victim is None or self._order_key(victim) < self._order_key(r):
                return False
            self._preempt(victim, out)
        return True

    # ---- the step ------------------------------------------------------------------------------
    def _chunk_limit(self) -> int:
        if self.shares_planes:
            return 1
        if not self.cfg.enable_chunked_prefill:
            return 1 << 62
        return self.cfg.prefill_chunk_size

    def schedule(self) -> SchedulerOutput:
        """Plan one step. With a draft policy, decode rows of speculative requests draft the count
        their own history gives (never cut to fit the batch: a row whose round does not fit this
        step's token budget waits, one that cannot get its blocks is preempted); greedy rows draft
        none while the engine holds more than `disable_by_batch_size` requests, else one count
        chosen for the round (`_greedy_drafts`)."""
        out = SchedulerOutput()
        budget = self.cfg.max_num_batched_tokens
        prefill_only = (
            not self.cfg.enable_chunked_prefill
            and self.waiting
            and self._consecutive_prefill_steps < self.cfg.max_consecutive_prefill_steps
            and self._can_admit_any()
        )
        # Whether each running request prefills, read once (the decode loop changes no running request;
        # a preemption removes one from `running`, after which the flags are read again).
        prefills = [r.is_prefilling for r in self.running]
        if not prefill_only and not self.hold_decodes:
            decoding = [r for r, p in zip(self.running, prefills) if not p]
            limit = self.draft_policy.disable_by_batch_size if self.draft_policy is not None else None
            # Requests in the engine (running or waiting), as vLLM counts them: a burst of arrivals
            # stops greedy drafts from its first step, while its prompts are still being admitted.
            crowded = limit is not None and len(self.running) + len(self.waiting) > limit  # greedy rows draft none
            for r in sorted(decoding, key=self._order_key):
                if out.preempted and r not in self.running:  # preempted while scheduling this step
                    continue
                if len(r.output_token_ids) + r.inflight_outputs >= r.max_tokens or budget < 1:
                    continue
                pos = r.num_computed + r.num_inflight
                k = 0
                if r.draft is not None:
                    k = self.draft_policy.drafts(r.draft, r.inflight_outputs,
                                                 0 if crowded and r.params.greedy else None)
                if 1 + k > budget:
                    continue
                if not self._allocate(r, pos + k + 1, out):
                    self._preempt(r, out)
                    continue
                out.decodes.append(r)
                out.num_drafts.append(k)
                budget -= 1 + k
            if not crowded:
                budget = self._greedy_drafts(out, budget)
        if out.preempted:
            prefills = [r.is_prefilling for r in self.running]
        prefilling = [r for r, p in zip(self.running, prefills) if p]
        if prefilling:
            k = self._rotation % len(prefilling)
            prefilling = prefilling[k:] + prefilling[:k]
            self._rotation += 1
        for r in prefilling:
            if budget <= 0 or r not in self.running:
                break
            budget -= self._schedule_prefill(r, budget, out)
        # No admission in a step that had to preempt: the freed blocks are what running requests need.
        if not out.preempted and (self.cfg.enable_chunked_prefill or prefill_only or not out.decodes):
            budget = self._admit(budget, out)
        self._consecutive_prefill_steps = self._consecutive_prefill_steps + 1 if (out.prefills and not out.decodes) else 0
        # A round runs with the most drafts any of its rows takes; rows that draft none (opted out,
        # close to max_tokens, or their policy says so) decode plainly in it, and a round of such
        # rows only is a plain decode step.
        out.round_k = max(out.num_drafts, default=0)
        out.block_updates = self.kv.take_updates()
        for r, k in zip(out.decodes, out.num_drafts):
            r.num_inflight += 1 + k  # an upper bound: the round commits 1..k+1 tokens
            r.inflight_outputs += 1  # a lower bound
        for c in out.prefills:
            c.request.num_inflight += len(c.token_ids)
            c.request.inflight_outputs += int(c.sample)
        return out

    def _greedy_drafts(self, out: SchedulerOutput, budget: int) -> int:
        """The count of the round's greedy rows, whose tokens do not depend on it: one count for the
        whole round (`greedy_rounds`, adaptive policy), or the round's largest (fixed policy). Each
        greedy row takes it within what it can still commit, the token budget and the blocks it can
        get without preempting. Returns the budget left."""
        policy = self.draft_policy
        greedy = [i for i, r in enumerate(out.decodes) if r.draft is not None and r.params.greedy]
        if not greedy:
            return budget
        if self.greedy_rounds is not None:
            chosen = set(greedy)
            others = [i for i in range(len(out.decodes)) if i not in chosen]
            target = self.greedy_rounds.drafts(
                [policy.expected(out.decodes[i].draft, out.decodes[i].inflight_outputs) for i in greedy],
                sum(self._expected_tokens(out, i) for i in others),
                max((out.num_drafts[i] for i in others), default=0), len(out.decodes),
                [policy.explores(out.decodes[i].draft, out.decodes[i].inflight_outputs) for i in greedy])
        else:
            target = max(out.num_drafts, default=0)
        for i in greedy:
            r, k = out.decodes[i], out.num_drafts[i]
            want = policy.within_cap(r.draft, r.inflight_outputs, target)
            if want > k and (want - k > budget or not self.kv.allocate(
                    r.request_id, r.slot, r.num_computed + r.num_inflight + want + 1)):
                continue
            if want != k:
                policy.set_drafts(r.draft, r.inflight_outputs, want)
                out.num_drafts[i] = want
                budget -= want - k
        return budget

    def _expected_tokens(self, out: SchedulerOutput, i: int) -> float:
        """What decode row i commits by its own count: 1 without drafts, else its policy's estimate."""
        r, k = out.decodes[i], out.num_drafts[i]
        return 1.0 if r.draft is None or k == 0 else self.draft_policy.expected(r.draft, r.inflight_outputs)[k]

    def _schedule_prefill(self, r: Request, budget: int, out: SchedulerOutput) -> int:
        start = r.num_computed + r.num_inflight
        n = min(r.prefill_target - start, self._chunk_limit(), budget)
        if not self.cfg.enable_chunked_prefill and not self.shares_planes and n < r.prefill_target - start:
            return 0
        if n <= 0 or not self._allocate(r, start + n, out):
            return 0
        ids = r.tokens_in(start, start + n)
        depths = r.depths_in(start, start + n, self.depth)
        sample = start + n == r.prefill_target and not r.output_token_ids
        out.prefills.append(PrefillChunk(r, start, ids, depths, sample))
        return n

    def _can_admit_any(self) -> bool:
        return bool(self.free_slots) and any(not self._waits_for_sibling(r) and self._fits(r, self.cfg.max_num_batched_tokens)
                                             for r in self.waiting[: self.cfg.admission_scan_limit])

    def _waits_for_sibling(self, r: Request) -> bool:
        """Whether a running sample of r's request is still computing the prompt's full blocks
        (r takes them from the cache once they are published instead of computing them again)."""
        if r.swapped is not None or r.params.num_samples == 1 or r.needs_prompt_logprobs:
            return False
        full = (r.num_prompt_tokens - 1) // self.kv.block_size * self.kv.block_size
        return full > 0 and any(s.group_id == r.group_id and s.num_computed < full for s in self.running)

    def lifetime_blocks(self, num_prompt_tokens: int, max_tokens: int, speculative: bool) -> int:
        """Physical blocks (all planes) a request can ever allocate: prompt + max_tokens - 1 positions,
        plus with speculative rounds the drafts of one round still in flight (an async round
        allocates from an upper bound of the position)."""
        spec = self.cfg.speculative_config
        slack = spec.num_speculative_tokens if spec is not None and speculative else 0
        return self.kv.blocks_for(num_prompt_tokens + max_tokens - 1 + slack) * self.kv.num_planes

    def _lifetime(self, r: Request) -> int:
        return self.lifetime_blocks(r.num_prompt_tokens, r.max_tokens, r.params.speculative)

    def _reserved(self) -> int:
        """Blocks running requests may still allocate before they finish (preemption off)."""
        return sum(max(0, self._lifetime(s) - len(self.kv.table(s.request_id)) * self.kv.num_planes) for s in self.running)

    def _first_chunk(self, r: Request, cached: int, budget: int) -> int:
        remaining = r.prefill_target - cached
        return min(remaining, self._chunk_limit(), budget)

    def _fits(self, r: Request, budget: int) -> bool:
        if r.swapped is not None:
            saved = r.swapped["num_computed"]
            chunk = self._first_chunk(r, saved, budget) if saved < r.prefill_target else 0
            return self._room_for(self.kv.blocks_for(saved + max(chunk, 1)) * self.kv.num_planes)
        cached, taken = self.kv.cached_prefix_cost(self.prompt_hashes(r)) if not r.needs_prompt_logprobs else (0, 0)
        chunk = self._first_chunk(r, cached, budget)
        if chunk <= 0:
            return False
        if not self.cfg.enable_chunked_prefill and not self.shares_planes and cached + chunk < r.prefill_target:
            return False
        if not self.cfg.enable_preemption:
            lifetime = self._lifetime(r) - cached // self.kv.block_size * self.kv.num_planes
            return self._room_for(lifetime + taken + self._reserved())
        return self._room_for((self.kv.blocks_for(cached + chunk) - cached // self.kv.block_size) * self.kv.num_planes)

    def _room_for(self, need: int) -> bool:
        """`need` new blocks leave the watermark reserve free (no reserve while nothing runs)."""
        reserve = int(self.cfg.watermark * self.kv.pool.num_blocks) if self.running else 0
        return self.kv.num_free_blocks - need >= reserve

    def prompt_hashes(self, r: Request) -> list[int]:
        """Cache keys of r's shareable blocks: the prompt's full blocks (never its last token). With
        prefix caching off they are salted by the request id, so only its own samples share them;
        a lone sample then shares nothing (empty list)."""
        if not self.kv.enable_prefix_caching and r.params.num_samples == 1:
            return []
        if r.prompt_block_hashes is None:
            salt = self.kv.cache_salt if self.kv.enable_prefix_caching else stable_hash(self.kv.cache_salt, r.group_id)
            r.prompt_block_hashes = self.kv.block_hashes(r.prompt_token_ids, salt)
        return r.prompt_block_hashes

    def publish(self, r: Request) -> None:
        """Register r's shareable blocks whose K/V has been computed (after a step's results)."""
        hashes = self.prompt_hashes(r)
        if hashes:
            self.kv.publish(r.request_id, hashes, r.num_computed)

    def _admit(self, budget: int, out: SchedulerOutput) -> int:
        blocked: list[Request] = []
        for r in list(self.waiting[: self.cfg.admission_scan_limit]):
            if budget <= 0:
                break
            if any(b.bypass_count >= self.cfg.max_admission_bypasses for b in blocked):
                break
            if self._waits_for_sibling(r):
                continue
            if not self.free_slots and not self._preempt_for_priority(r, out):
                blocked.append(r)
                continue
            if not self._fits(r, budget):
                blocked.append(r)
                continue
            self._start(r, budget, out)
            budget -= sum(len(c.token_ids) for c in out.prefills if c.request is r)
            for b in blocked:
                b.bypass_count += 1
        return budget

    def _preempt_for_priority(self, r: Request, out: SchedulerOutput) -> bool:
        """Priority policy: free a slot from a strictly lower-priority running request."""
        if self.cfg.scheduling_policy != "priority" or not self.cfg.enable_preemption or not self.running:
            return False
        victim = max(self.running, key=self._order_key)
        if victim.params.priority <= r.params.priority:
            return False
        self._preempt(victim, out)
        return True

    def _start(self, r: Request, budget: int, out: SchedulerOutput) -> None:
        self.waiting.remove(r)
        r.slot = self.free_slots.pop()
        r.status = Status.RUNNING
        r.bypass_count = 0
        self.running.append(r)
        out.admitted.append(r)
        if r.swapped is not None:
            saved = r.swapped["num_computed"]
            self.kv.allocate(r.request_id, r.slot, saved)  # _fits checked the room
            out.swap_in.append((r, list(self.kv.table(r.request_id))))
            r.num_computed = saved
            if not r.is_prefilling:
                return  # decodes from the next step on
        else:
            # Prompt blocks only (see the module docstring); never the prompt's last token. A request
            # that computes prompt log-probabilities runs every prompt position (no prefix hit).
            hashes = [] if r.needs_prompt_logprobs else self.prompt_hashes(r)
            r.num_computed = self.kv.attach_prefix(r.request_id, r.slot, hashes)
        if r.metrics is not None and r.metrics.num_cached_tokens == 0:
            r.metrics.num_cached_tokens = r.num_computed
        if self._schedule_prefill(r, budget, out) == 0 and r in self.running and r.swapped is None:
            # Could not even start: put it back (keeps the prefix references released).
            self.running.remove(r)
            self._release(r)
            r.status = Status.WAITING
            out.admitted.remove(r)
            self.add(r)
