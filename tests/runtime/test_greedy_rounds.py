"""The greedy rows' round count (`engine.greedy_rounds`) on simulated batches.

A batch of greedy requests runs rounds whose drafts pass with a known probability, drawn per
request and output position from a seed. The simulated device prices a step by its rows,
T(rows) = 1 + slope * rows (in plain steps of one row), so a round with K drafts over B requests
costs (K + 1) draft passes of d/D over B rows and a verify pass of (D - d)/D over (K + 1) B rows; the
engine's measurement is played by recording each step's cost, as the engine records device times,
one step in ten recorded three times dearer (a stall: device times only ever exceed a step's cost).
The round count must pay for the batch as a whole: never below plain decoding by more than 2%, and
near the best fixed count where drafting clearly pays.
"""

from __future__ import annotations

import random

import pytest

from rlt_runtime.engine.draft_policy import DraftPolicy
from rlt_runtime.engine.greedy_rounds import GreedyRounds, RoundCosts

K_MAX, D_LOOPS, DEPTH = 4, 2, 4


def round_cost(k: int, batch: int, slope: float) -> float:
    """Device cost of a round (plain-step units at one row), from the row-cost model."""
    t = lambda rows: 1.0 + slope * rows  # noqa: E731
    if k == 0:
        return t(batch)
    return (k + 1) * D_LOOPS / DEPTH * t(batch) + (DEPTH - D_LOOPS) / DEPTH * t((k + 1) * batch)


def committed(seed: int, position: int, k: int, acceptance: float) -> int:
    """1 + the drafts of a round that pass in a row (seeded draws per output position)."""
    n = 0
    while n < k and random.Random(seed * 1_000_003 + position + n).random() < acceptance:
        n += 1
    return n + 1


def simulate(acceptance: float, batch: int, slope: float, steps: int = 300, fixed: int | None = None) -> float:
    """Committed tokens per unit of device cost: the greedy round count, or a fixed count."""
    policy = DraftPolicy(K_MAX, D_LOOPS, DEPTH)
    rounds = GreedyRounds(policy.cost)
    states = [policy.new_state(10**9) for _ in range(batch)]
    for s in states:
        policy.observe(s, 0, 1)  # round 0: the prefill's sampled token
    positions = [0] * batch
    stalls = random.Random(batch)
    tokens = cost = 0.0
    for _ in range(steps):
        for s in states:
            policy.drafts(s, 0)  # each row's own count first, as the scheduler asks it
        if fixed is None:
            k = rounds.drafts([policy.expected(s, 0) for s in states], 0.0, 0, batch,
                              [policy.explores(s, 0) for s in states])
        else:
            k = fixed
        for i, s in enumerate(states):
            policy.set_drafts(s, 0, policy.within_cap(s, 0, k))
            n = committed(i, positions[i], k, acceptance)
            policy.observe(s, k, n)
            positions[i] += n
            tokens += n
        step = round_cost(k, batch, slope)
        rounds.costs.record(batch, k, step * (3.0 if stalls.random() < 0.1 else 1.0))
        cost += step
    return tokens / cost


@pytest.mark.parametrize("slope", [0.0, 0.005, 0.02])
@pytest.mark.parametrize("batch", [1, 16, 64])
@pytest.mark.parametrize("acceptance", [0.0, 0.5, 0.7, 0.9])
def test_round_count_never_loses_to_plain_decoding_and_finds_clear_wins(acceptance, batch, slope):
    native = batch / round_cost(0, batch, slope)
    best = max(simulate(acceptance, batch, slope, fixed=k) for k in range(K_MAX + 1))
    rate = simulate(acceptance, batch, slope)
    assert rate >= 0.98 * native, (rate / native, best / native)
    if best >= 1.1 * native:
        assert rate >= 0.9 * best, (rate / native, best / native)


def test_the_round_count_is_the_batch_s_not_its_luckiest_row_s():
    """16 rows whose estimates scatter around 0.7 (1 draft pays, 2 do not, by the static cost): each
    row's own choice reaches 2 or more in some rows, the round takes 1."""
    policy = DraftPolicy(K_MAX, D_LOOPS, DEPTH)
    states = [policy.new_state(10**9) for _ in range(16)]
    for i, s in enumerate(states):
        policy.observe(s, 0, 1)
        for position in range(0, 64, 3):
            policy.drafts(s, 0)
            policy.set_drafts(s, 0, 2)
            policy.observe(s, 2, committed(100 + i, position, 2, 0.7))
    own = [policy.drafts(s, 0) for s in states]
    assert max(own) >= 2
    rounds = GreedyRounds(policy.cost, plain_tried={16}, last_above={1: 0})
    assert rounds.drafts([policy.expected(s, 0) for s in states], 0.0, 0, 16) == 1


def test_measured_costs_replace_the_static_ones_and_the_plain_step_is_timed_first():
    policy = DraftPolicy(K_MAX, D_LOOPS, DEPTH)
    sure = [(1.0, 2.0, 3.0, 4.0, 5.0)] * 8  # every draft passes: the static cost says draft all 4
    rounds = GreedyRounds(policy.cost, last_above={k: 0 for k in range(K_MAX)})
    assert rounds.drafts(sure, 0.0, 0, 8) == 0  # the bucket's plain step, once
    assert rounds.drafts(sure, 0.0, 0, 8) == 4
    rounds.costs.record(8, 0, 1.0)
    for k in range(1, K_MAX + 1):
        rounds.costs.record(8, k, 1.0 + 2.0 * k)  # rounds much dearer than the static 1 + k / 2
    assert rounds.drafts(sure, 0.0, 0, 8) == 0
    assert rounds.drafts(sure, 8.0, 2, 8) == 2  # sampled rows' count is the least the round runs
    rounds.costs.record(8, 1, 40.0)  # a stall: a round's cost is the least of its recent samples
    assert rounds.costs.relative(8, 1) == 3.0
    assert RoundCosts.bucket(5) == 8 and RoundCosts.bucket(8) == 8 and RoundCosts.bucket(1) == 1
    assert rounds.costs.table() == {"8": {"0": 1.0, "1": 3.0, "2": 5.0, "3": 7.0, "4": 9.0}}


def test_fresh_requests_explore_together_and_a_lone_one_waits():
    """After probes backed off (drafts did not pay), a round whose greedy rows are mostly fresh
    requests exploring position 1 takes one draft; a lone fresh request among settled rows does not
    make the round probe."""
    policy = DraftPolicy(K_MAX, D_LOOPS, DEPTH)
    rounds = GreedyRounds(policy.cost, plain_tried={4}, last_above={0: 0}, wait=1024)
    flat = [(1.0, 1.1, 1.15, 1.2, 1.2)] * 4  # drafts that do not pay
    assert rounds.drafts(flat, 0.0, 0, 4, [0, 0, 0, 1]) == 0
    assert rounds.drafts(flat, 0.0, 0, 4, [1, 1, 0, 0]) == 1
    assert rounds.drafts(flat, 0.0, 0, 4, [2, 2, 2, 2]) == 0  # they explore position 2, the round's next is 1
