"""How many tokens to draft per speculative round (plain Python).

`fixed` always drafts K. `adaptive` picks k in [0, K] maximising expected committed tokens per
unit of predicted round time:

    E(k) = 1 + sum_{j=1..k} prod_{i<=j} a_i        (a_i: acceptance of draft i given i-1 passed)
    T(k) = measured device time of a round with k drafts at this batch bucket
           (k = 0 is a plain decode step)

Per-position acceptance is the running mean of what was observed, from a prior of one passed and
one rejected draft (a run of early rejections must not pin an estimate at exactly 0, where a round
costing no more than a step would lose the tie to k = 0 for good), until it settles into
exponential forgetting; a position seen fewer than MIN_SAMPLES times is counted optimistically
(see `expected_tokens`). Round times are moving averages of device-measured rounds; a draft count
not measured yet at a bucket is extrapolated from the nearest measured one (each draft pass costs
draft_loops/D of a decode step) or, before any round was measured there, taken from a cost model
(k + 1 draft passes and a verify pass of (D - draft_loops)/D of a step).

When some k > 0 wins, its neighbours k - 1 and k + 1 are each tried once at that bucket, so their
times get measured rather than extrapolated. To keep learning while k = 0 wins, a probe round with
one draft (the cheapest round that still measures the first draft's acceptance) runs after
`probe_every` native steps; each probe that leaves k = 0 the winner doubles the interval, up to
`MAX_PROBE_EVERY`, and the interval resets as soon as the policy itself picks k > 0. With drafts
that never pass, probes then cost about half a decode step per thousand steps.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

FORGET = 0.02  # weight of the newest observation once an estimate has settled
MIN_SAMPLES = 16  # drafts offered at a position before its estimate is taken at face value
PRIOR_SAMPLES = 2  # pseudo-drafts (one passed, one rejected) each estimate starts from
MAX_PROBE_EVERY = 1024  # native steps between probes, at most


@dataclass
class DraftPolicy:
    max_drafts: int
    draft_loops: int
    depth: int
    adaptive: bool = True
    probe_every: int = 32
    accept: list = field(default_factory=list)  # a_1..a_K estimates
    _offered: list = field(default_factory=list)  # drafts offered per position so far
    _times: dict = field(default_factory=dict)  # (bucket, k) -> ms
    _tried: set = field(default_factory=set)  # (bucket, k) neighbours already tried once
    _since_probe: int = 0
    _probe_interval: int = 0
    chosen: dict = field(default_factory=lambda: defaultdict(int))  # k -> rounds (histogram)

    def __post_init__(self):
        if not self.accept:
            self.accept = [0.5] * self.max_drafts  # the prior: PRIOR_SAMPLES drafts, half passed
        self._offered = [0] * self.max_drafts
        self._probe_interval = self.probe_every

    def expected_tokens(self, k: int) -> float:
        """Committed tokens per request of a round with k drafts. A position offered n <
        MIN_SAMPLES times counts as a + (1 - a)(1 - n / MIN_SAMPLES): optimism that fades as it is
        measured, so no position is written off on a few unlucky drafts."""
        total, run = 1.0, 1.0
        for i in range(k):
            a = self.accept[i]
            run *= a + (1.0 - a) * max(0.0, 1.0 - self._offered[i] / MIN_SAMPLES)
            total += run
        return total

    def predicted_ms(self, bucket: int, k: int) -> float:
        """Device time of a round with k drafts at this bucket: measured, else extrapolated from the
        nearest measured round (each draft adds draft_loops/D of a step), else the cost model."""
        measured = self._times.get((bucket, k))
        if measured is not None:
            return measured
        step = self._times.get((bucket, 0))
        if step is None:
            step = 1.0
        draft = self.draft_loops / self.depth
        if k > 0:
            known = [j for j in range(1, self.max_drafts + 1) if (bucket, j) in self._times]
            if known:
                j = min(known, key=lambda j: abs(j - k))
                return max(self._times[(bucket, j)] + (k - j) * draft * step, 1e-9)
        verify = (self.depth - self.draft_loops) / self.depth
        return step * ((k + 1) * draft + verify * (1.0 + 0.05 * k))

    def choose(self, bucket: int) -> int:
        """Drafts for the next round at this row bucket."""
        if not self.adaptive:
            k = self.max_drafts
        else:
            k = max(range(self.max_drafts + 1), key=lambda j: self.expected_tokens(j) / self.predicted_ms(bucket, j))
            if k > 0:
                self._since_probe, self._probe_interval = 0, self.probe_every
                # Try the neighbouring draft counts once per bucket: their predicted times are only
                # extrapolations, and a wrong guess would otherwise never be corrected.
                untried = [j for j in (k - 1, k + 1) if 1 <= j <= self.max_drafts
                           and (bucket, j) not in self._times and (bucket, j) not in self._tried]
                if untried:
                    k = untried[0]
                    self._tried.add((bucket, k))
            else:
                self._since_probe += 1
                if self._since_probe >= self._probe_interval and self.max_drafts > 0:
                    self._since_probe, k = 0, 1
                    self._probe_interval = min(2 * self._probe_interval, MAX_PROBE_EVERY)
        self.chosen[k] += 1
        return k

    def observe_round(self, bucket: int, k: int, accepted: list[int], drafted: list[int], device_ms) -> None:
        """Update from one round: per request, drafts offered and accepted; the round's device time."""
        for i in range(k):
            offered = sum(1 for a, d in zip(accepted, drafted) if d > i and a >= i)
            passed = sum(1 for a, d in zip(accepted, drafted) if d > i and a > i)
            if offered:
                self._offered[i] += offered
                weight = max(FORGET, offered / (self._offered[i] + PRIOR_SAMPLES))  # running mean, then forgetting
                self.accept[i] += weight * (passed / offered - self.accept[i])
        if device_ms is not None:
            key = (bucket, k)
            old = self._times.get(key)
            self._times[key] = device_ms if old is None else old + 0.2 * (device_ms - old)
