"""How many tokens each request drafts in a speculative round (plain Python).

Sampled speculation commits tokens distributed exactly as plain sampling, but which random draws
are made depends on how many drafts were taken. So that a seeded request commits the same tokens
whatever else the engine runs, a request's draft count is a function of its own committed
results and of the engine configuration only: never of measured timings, nor of its batch
neighbours (batch size and graph bucket included). A round runs with the largest count its rows
take; a row drafting fewer (or none) is unaffected by that.

`fixed` drafts K. `adaptive` picks k in [0, K] maximising expected committed tokens per unit of a
static cost, in decode steps, from the configuration (draft loops d of depth D):

    E(k) = 1 + sum_{j=1..k} a_1 * ... * a_j   (a_i: acceptance of draft i given the earlier passed)
    C(k) = 1 + k * d / D                      (k + 1 draft passes of d/D of a step each, and a
                                               verify pass of (D - d)/D; k = 0 is a decode step)

Ties go to the smaller k. a_i is the request's own estimate: drafts offered and passed at position
i, counts decayed by FORGET per draft offered there, over a prior of PRIOR_WEIGHT drafts at the
estimate of position i - 1 (position 1: 1/2), so deeper positions start from what the shallower
ones showed. An estimate only moves when its position is offered, so the policy probes one
position past its choice: where the estimate picks k (below the cap) and the request's last round
with more than k drafts is at least wait_k rounds back, it takes k + 1 (a fresh request at k = 0
probes at once with one draft, the cheapest round that measures a_1). A round that takes position
p + 1 resets wait_p to PROBE_EVERY when its draft there passed or its result makes more than p
drafts the winner, else doubles it (32, 64, ... up to MAX_PROBE_EVERY): drafts that never pass
cost one probe round in ever longer stretches, and a deeper position that was judged too early is
measured again.

Greedy rows (temperature 0) commit the same tokens whatever they draft, so for them the count may
follow the load: while more than `disable_by_batch_size` requests are in the engine, running or
waiting (vLLM's count), they draft none (a large batch's step is no longer bound by reading the
weights, and a round's extra tokens cost about what they save; counting the waiting requests stops
drafts from the first step of a burst, while its prompts are still being admitted). Otherwise the
round's greedy rows all draft one count (within what each can still commit), chosen for the round:
with the fixed policy its largest count, with the adaptive one the count that pays best for the
round as a whole by its rows' estimates and measured round costs (`greedy_rounds`). Sampled rows
never see either rule.

Timing of information: with async scheduling a request's round m is planned while round m - 1 is
still in flight, so round m's count uses the request's results through round m - 2 (round 0 is
the token its prefill sampled) and the count round m - 1 took. Sync scheduling follows the same
rule, so both take the same counts. Near max_tokens, k is at most what round m can still commit if
round m - 1 committed everything it drafted: max_tokens - (tokens through round m - 2) -
(k_{m-1} + 1) - 1. Preemption discards rounds in flight and keeps the committed history, so the
counts continue as if it had not happened.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

FORGET = 1 / 16  # decay of a position's counts per draft offered there (about 16 drafts of memory)
PRIOR_WEIGHT = 2.0  # pseudo-drafts behind each position's prior
PRIOR_ACCEPT = 0.5  # the prior of the first position
PROBE_EVERY = 16  # the wait while drafts pay; each round with drafts that do not pay doubles it (32, 64, ...)
MAX_PROBE_EVERY = 1024  # the longest wait, in the request's rounds at k = 0


@dataclass(frozen=True)
class DraftHistory:
    """A request's committed rounds through `round`, folded into what later counts depend on."""

    round: int  # the last committed round (0: the prefill's sampled token, -1: none yet)
    tokens: int  # output tokens committed through `round`
    offered: tuple  # [K] decayed drafts offered per position
    passed: tuple  # [K] decayed drafts passed per position
    last: tuple  # [K] last[p]: the last round that took more than p drafts
    wait: tuple  # [K] wait[p]: rounds after last[p] before a round at p drafts probes p + 1
    best: tuple  # [K + 1] best[c]: the winning draft count among 0..c (adaptive only)
    expected: tuple  # [K + 1] expected[k]: E(k), the tokens a round with k drafts commits (adaptive only)


@dataclass
class DraftState:
    """Per request: its history after the last committed round and after the one before, and the
    counts its recent rounds were given (round index -> k)."""

    max_tokens: int
    current: DraftHistory
    previous: DraftHistory
    decided: dict = field(default_factory=dict)


@dataclass
class DraftPolicy:
    max_drafts: int  # K (already capped so that one round fits the token budget)
    draft_loops: int
    depth: int
    adaptive: bool = True
    disable_by_batch_size: int | None = None  # greedy rows draft none while more requests run or wait
    chosen: dict = field(default_factory=lambda: defaultdict(int))  # k -> committed request-rounds (a stat)

    def new_state(self, max_tokens: int) -> DraftState:
        zeros = (0.0,) * self.max_drafts
        start = DraftHistory(-1, 0, zeros, zeros, (-PROBE_EVERY,) * self.max_drafts, (PROBE_EVERY,) * self.max_drafts,
                             *self._best(zeros, zeros))
        return DraftState(max_tokens, start, start)

    def cost(self, k: int) -> float:
        """Static cost of a round with k drafts, in decode steps."""
        return 1.0 + k * self.draft_loops / self.depth

    @staticmethod
    def acceptance(offered, passed) -> list[float]:
        """The estimates a_1..a_K from decayed counts per position."""
        out, prior = [], PRIOR_ACCEPT
        for n, p in zip(offered, passed):
            prior = (p + PRIOR_WEIGHT * prior) / (n + PRIOR_WEIGHT)
            out.append(prior)
        return out

    def _best(self, offered: tuple, passed: tuple) -> tuple:
        """(best, expected) of `DraftHistory` for these counts."""
        if not self.adaptive:
            return (), ()
        best, best_k, best_rate, expected, run = [0], 0, 1.0, [1.0], 1.0
        for k, a in enumerate(self.acceptance(offered, passed), start=1):
            run *= a
            expected.append(expected[-1] + run)
            rate = expected[-1] / self.cost(k)
            if rate > best_rate:
                best_k, best_rate = k, rate
            best.append(best_k)
        return tuple(best), tuple(expected)

    def drafts(self, state: DraftState, in_flight: int, limit: int | None = None) -> int:
        """Drafts for the request's next round; in_flight: its rounds submitted whose results have
        not arrived (0 or 1; its prefill's sampled token counts as round 0); limit: at most this
        many (the scheduler's, for rows whose tokens do not depend on the count)."""
        m, base, k_prev, cap = self._next_round(state, in_flight)
        if limit is not None:
            cap = min(cap, limit)
        if cap <= 0:
            k = 0
        elif not self.adaptive:
            k = cap
        else:
            k = base.best[cap]
            if k < cap:  # probe position k + 1 when no round took it for wait_k rounds (round m - 1 counts)
                last = m - 1 if k_prev > k else base.last[k]
                if m - 1 - last >= base.wait[k]:
                    k += 1
        state.decided[m] = k
        state.decided.pop(m - 3, None)  # rounds m - 1 and m may still be planned again after a preemption
        return k

    def _next_round(self, state: DraftState, in_flight: int) -> tuple:
        """(m, the history round m's count depends on, round m - 1's count, the most drafts round m
        can use) for the request's next round m."""
        if in_flight not in (0, 1):
            raise ValueError(f"a request has 0 or 1 rounds in flight, got {in_flight}")
        m = state.current.round + 1 + in_flight
        base = state.current if in_flight else state.previous
        assert base.round == m - 2, (base.round, m)
        k_prev = 0 if m == 1 else state.decided[m - 1]
        return m, base, k_prev, min(self.max_drafts, state.max_tokens - base.tokens - k_prev - 2)

    def explores(self, state: DraftState, in_flight: int) -> int:
        """The count `drafts` just decided for the request's next round when it probes a position
        the request was never offered (adaptive; a fresh request does at once), else 0."""
        m, base, _, cap = self._next_round(state, in_flight)
        best, k = base.best[max(cap, 0)], state.decided[m]
        return k if k > best and base.offered[best] == 0.0 else 0

    def expected(self, state: DraftState, in_flight: int) -> tuple:
        """E(0..cap) for the request's next round (adaptive): expected tokens committed by a round of
        each draft count it can take, by the estimates its count depends on."""
        _, base, _, cap = self._next_round(state, in_flight)
        return base.expected[:max(cap, 0) + 1]

    def within_cap(self, state: DraftState, in_flight: int, k: int) -> int:
        """k drafts for the request's next round (just decided by `drafts`), within what the round can
        still commit."""
        _, _, _, cap = self._next_round(state, in_flight)
        return max(0, min(k, cap))

    def set_drafts(self, state: DraftState, in_flight: int, k: int) -> None:
        """Replace the next round's decided count by k (from `within_cap`): for rows whose tokens do
        not depend on the count (greedy rows, `greedy_rounds`)."""
        m, _, _, _ = self._next_round(state, in_flight)
        state.decided[m] = k

    def observe(self, state: DraftState, k: int, committed: int) -> None:
        """Fold one committed round of the request: k drafts, `committed` tokens (accepted + 1)."""
        h = state.current
        if h.round >= 0:
            self.chosen[k] += 1
        state.previous = h
        if k == 0:  # a plain step: no position was offered, so only the round and the tokens move
            state.current = DraftHistory(h.round + 1, h.tokens + committed, h.offered, h.passed, h.last, h.wait, h.best,
                                         h.expected)
            return
        accepted = committed - 1
        offered, passed = list(h.offered), list(h.passed)
        for i in range(min(k, accepted + 1)):  # draft i + 1 was tested: the i before it passed
            offered[i] = offered[i] * (1.0 - FORGET) + 1.0
            passed[i] = passed[i] * (1.0 - FORGET) + float(accepted > i)
        best, expected = self._best(tuple(offered), tuple(passed))
        last, wait = list(h.last), list(h.wait)
        if self.adaptive:
            for p in range(k):  # the round took position p + 1
                last[p] = h.round + 1
                wait[p] = PROBE_EVERY if best[-1] > p or accepted > p else min(2 * wait[p], MAX_PROBE_EVERY)
        state.current = DraftHistory(round=h.round + 1, tokens=h.tokens + committed, offered=tuple(offered),
                                     passed=tuple(passed), last=tuple(last), wait=tuple(wait), best=best,
                                     expected=expected)
