"""The adaptive draft-count policy against a simulated device: rounds cost a known time and each
draft passes with a known probability, so the best achievable throughput is known exactly."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_runtime.engine.draft_policy import DraftPolicy

STEP_MS = 10.0


def round_ms(k: int, draft_cost: float, overhead: float) -> float:
    """Device time of a round with k drafts (k = 0: a native step): k draft passes of d of the D
    loops (draft_cost = d/D of a step each) and a verify pass of the other D - d loops, plus the
    round's fixed overhead (extra LM heads, acceptance), all in native steps."""
    return STEP_MS if k == 0 else STEP_MS * (k * draft_cost + (1.0 - draft_cost) + overhead)


def best_rate(k_max: int, acceptance: float, draft_cost: float, overhead: float) -> float:
    """Tokens per ms of the best fixed k (k = 0 included), from the exact expectation."""
    def expected(k):
        return sum(acceptance ** j for j in range(k + 1))
    return max(expected(k) / round_ms(k, draft_cost, overhead) for k in range(k_max + 1))


def simulate(policy: DraftPolicy, steps: int, acceptance, draft_cost: float, overhead: float, seed: int = 0,
             batch: int = 1, timed: bool = True) -> list[tuple[int, float]]:
    """Run `steps` policy decisions; returns (tokens, ms) per step. `acceptance(step)` may vary;
    timed=False reports no device time (a CPU engine)."""
    rng = random.Random(seed)
    trace = []
    for i in range(steps):
        a = acceptance(i) if callable(acceptance) else acceptance
        k = policy.choose(batch)
        accepted = []
        for _ in range(batch):
            n = 0
            while n < k and rng.random() < a:
                n += 1
            accepted.append(n)
        ms = round_ms(k, draft_cost, overhead)
        policy.observe_round(batch, k, accepted, [k] * batch, ms if timed else None)
        trace.append((sum(accepted) + batch, ms))
    return trace


def rate(trace) -> float:
    return sum(t for t, _ in trace) / sum(ms for _, ms in trace)


def test_useless_drafts_cost_under_one_percent():
    """Drafts that never pass (the random-init replica): probes must not cost more than 1%."""
    policy = DraftPolicy(max_drafts=4, draft_loops=2, depth=4)
    trace = simulate(policy, 4000, 0.0, draft_cost=0.5, overhead=0.1)
    assert rate(trace) >= 0.99 / STEP_MS
    assert sum(1 for k, n in policy.chosen.items() if k > 0 for _ in range(n)) < 40


def test_good_drafts_are_used():
    policy = DraftPolicy(max_drafts=4, draft_loops=1, depth=4)
    trace = simulate(policy, 2000, 0.9, draft_cost=0.25, overhead=0.05)
    assert rate(trace) >= 0.95 * best_rate(4, 0.9, 0.25, 0.05)
    assert max(policy.chosen, key=policy.chosen.get) >= 2


def test_policy_follows_a_change_of_acceptance():
    """Good drafts that turn useless, then good again: each phase ends near its own optimum."""
    policy = DraftPolicy(max_drafts=4, draft_loops=1, depth=4)
    phases = [(0.9, 3000), (0.0, 3000), (0.9, 3000)]
    bounds = [sum(n for _, n in phases[:i + 1]) for i in range(len(phases))]
    trace = simulate(policy, bounds[-1], lambda i: next(a for (a, _), b in zip(phases, bounds) if i < b),
                     draft_cost=0.25, overhead=0.05)
    start = 0
    for (a, n), end in zip(phases, bounds):
        tail = trace[end - n // 2:end]  # the second half of each phase
        assert rate(tail) >= 0.95 * best_rate(4, a, 0.25, 0.05), (a, start)
        start = end


def test_without_device_times_the_choice_settles():
    """No round is ever timed (CPU): each neighbour is tried once, then the cost model's choice
    holds."""
    policy = DraftPolicy(max_drafts=4, draft_loops=1, depth=4)
    simulate(policy, 40, 0.9, draft_cost=0.25, overhead=0.05, timed=False)
    before = dict(policy.chosen)
    simulate(policy, 200, 0.9, draft_cost=0.25, overhead=0.05, seed=1, timed=False)
    grown = {k: policy.chosen[k] - before.get(k, 0) for k in policy.chosen if policy.chosen[k] > before.get(k, 0)}
    best = max(range(5), key=lambda j: policy.expected_tokens(j) / policy.predicted_ms(1, j))
    assert best > 0 and grown == {best: 200}


def test_fixed_policy_always_drafts_k():
    policy = DraftPolicy(max_drafts=3, draft_loops=2, depth=4, adaptive=False)
    simulate(policy, 50, 0.0, draft_cost=0.5, overhead=0.1)
    assert dict(policy.chosen) == {3: 50}


@settings(max_examples=100, deadline=None)
@given(acceptance=st.floats(0.0, 1.0), draft_cost=st.floats(0.1, 0.6), overhead=st.floats(0.0, 0.5),
       k_max=st.integers(1, 6), batch=st.sampled_from([1, 8]), seed=st.integers(0, 10**6))
def test_adaptive_never_loses_to_native_and_finds_clear_wins(acceptance, draft_cost, overhead, k_max, batch, seed):
    """Whatever the acceptance and round costs, adaptive K stays within 2% of native decoding, and
    where some k beats native by 25% or more it gets within 10% of the best fixed k."""
    policy = DraftPolicy(max_drafts=k_max, draft_loops=1, depth=4)
    trace = simulate(policy, 3000, acceptance, draft_cost, overhead, seed=seed, batch=batch)
    got, native = rate(trace[1000:]), batch / STEP_MS
    best = best_rate(k_max, acceptance, draft_cost, overhead) * batch
    assert got >= 0.98 * native
    if best >= 1.25 * native:
        assert got >= 0.90 * best
