"""One draft count for the greedy rows of a speculative round, chosen for the whole round.

A round's passes cost what its largest count costs, and a greedy row (temperature 0) commits the
same tokens whatever it drafts. Left to pick their own counts from their own noisy acceptance
estimates, a batch's greedy rows run nearly every round at the largest count any of them picks, with
each row's own probe of one position deeper falling in a different round (H200, Ouro-1.4B at
synthetic acceptance 0.7: batch 16 ran 76% of its request-rounds at 2 drafts where 1 pays, 0.88x
of plain decoding; batch 64 0.87x). So the round takes one count K for all its greedy rows, the one
that maximises its expected committed tokens per unit of its cost:

    (F + sum_g E_g(min(K, cap_g))) / C(K)        K >= F_k

E_g(k): a greedy row's expected tokens with k drafts by its own estimates (`DraftPolicy.expected`),
cap_g what it can still commit; F: what the round's other rows commit by their own counts, the
largest of which is F_k; C(K): the round's device time over a plain step's at the same rows bucket,
measured on decode-only steps (`RoundCosts`), else the static 1 + K d / D of `DraftPolicy.cost`
(exact while a round's rows do not change what a pass costs, as at batch 1; at larger batches the
verify pass's K + 1 rows per request make it dearer, which only a measurement shows). Every so often
the round takes K + 1 (a probe, every PROBE_EVERY rounds, doubling up to MAX_PROBE_EVERY while
probes leave K unchanged, and whenever half its greedy rows or more probe a position they were never
offered, as a batch of fresh requests does at once), which measures position K + 1's acceptance and
its round's cost. At a bucket whose plain step has not been timed, a round that could run plainly
does so, once (the denominator of every C there). Sampled rows keep their own counts (`DraftPolicy.drafts`): their
tokens depend on the count, so it may only depend on their own history.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from .draft_policy import MAX_PROBE_EVERY, PROBE_EVERY

RECENT = 8  # device-time samples kept per (bucket, drafts)


@dataclass
class RoundCosts:
    """Device ms of decode-only steps by (rows bucket, round drafts): the least of the last RECENT
    samples of each (a step's device time only ever exceeds its cost: a first replay, a stall, a
    wait for the host; the least recent sample still follows a cost that grows with the context).
    Buckets are powers of two of a step's decode rows."""

    ms: dict = field(default_factory=dict)

    @staticmethod
    def bucket(rows: int) -> int:
        return 1 << max(rows - 1, 0).bit_length()

    def record(self, rows: int, drafts: int, device_ms: float) -> None:
        self.ms.setdefault((self.bucket(rows), drafts), deque(maxlen=RECENT)).append(device_ms)

    def measured(self, rows: int, drafts: int) -> bool:
        return (self.bucket(rows), drafts) in self.ms

    def table(self) -> dict:
        """{bucket: {drafts: ms}} of what each measured (bucket, drafts) is priced at (str keys)."""
        out: dict = {}
        for (bucket, drafts), samples in sorted(self.ms.items()):
            out.setdefault(str(bucket), {})[str(drafts)] = min(samples)
        return out

    def relative(self, rows: int, drafts: int) -> Optional[float]:
        """A round's device time over a plain step's at the rows' bucket, once both are measured."""
        b = self.bucket(rows)
        plain, ms = self.ms.get((b, 0)), self.ms.get((b, drafts))
        return None if plain is None or ms is None else min(ms) / min(plain)


@dataclass
class GreedyRounds:
    """The round-level choice for greedy rows (module docstring); static_cost: `DraftPolicy.cost`."""

    static_cost: Callable[[int], float]
    costs: RoundCosts = field(default_factory=RoundCosts)
    rounds: int = 0  # rounds decided with greedy rows
    last_above: dict = field(default_factory=dict)  # k -> the last round that ran more than k drafts
    wait: int = PROBE_EVERY
    probed_best: int = -1  # the choice when the last probe was taken
    plain_tried: set = field(default_factory=set)  # buckets whose plain step a round gave way to

    def cost(self, rows: int, k: int) -> float:
        measured = self.costs.relative(rows, k) if k else 1.0
        return self.static_cost(k) if measured is None else measured

    def drafts(self, expected: list, fixed_tokens: float, fixed_k: int, rows: int, exploring: tuple = ()) -> int:
        """The round's count for its greedy rows. expected: per greedy row, its E(0..cap) (list);
        fixed_tokens, fixed_k: what the other rows commit, and their largest count; rows: the
        round's decode rows; exploring: per greedy row, its own count (`DraftPolicy.drafts`) where
        it probes a position it was never offered, else 0 (`DraftPolicy.explores`: a fresh request
        at once): when half the greedy rows or more would explore the round's position K + 1, the
        round probes it."""
        self.rounds += 1
        top = max((len(e) - 1 for e in expected), default=0)
        if top <= fixed_k:
            k = fixed_k
        elif fixed_k == 0 and not self.costs.measured(rows, 0) and self.costs.bucket(rows) not in self.plain_tried:
            self.plain_tried.add(self.costs.bucket(rows))
            k = 0  # time the bucket's plain step (once: a step that also prefills is not timed)
        else:
            k = max(range(fixed_k, top + 1), key=lambda c: (
                (fixed_tokens + sum(e[min(c, len(e) - 1)] for e in expected)) / self.cost(rows, c), -c))
            if k < top and 2 * sum(e == k + 1 for e in exploring) >= len(expected):
                k += 1
            elif k < top and self.rounds - self.last_above.get(k, -MAX_PROBE_EVERY) > self.wait:
                self.wait = PROBE_EVERY if k > self.probed_best else min(2 * self.wait, MAX_PROBE_EVERY)
                self.probed_best = k
                k += 1
        for p in range(k):
            self.last_above[p] = self.rounds
        return k
