"""Scheduler and block-accounting properties (plain Python, no model)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_runtime.cache.block_pool import BlockPool
from rlt_runtime.cache.kv_cache import KVCacheManager
from rlt_runtime.config import EngineConfig
from rlt_runtime.engine.request import Request
from rlt_runtime.engine.scheduler import Scheduler
from rlt_runtime.outputs import RequestMetrics
from rlt_runtime.sampling_params import SamplingParams

DEPTH = 4


def make(num_blocks=64, planes=DEPTH, block_size=4, prefix=True, shares=False, **cfg_kwargs):
    cfg = EngineConfig.from_kwargs(**cfg_kwargs)
    cfg.max_num_seqs = cfg.max_num_seqs or 4
    cfg.max_num_batched_tokens = cfg.max_num_batched_tokens or 16
    cfg.prefill_chunk_size = cfg.prefill_chunk_size or cfg.max_num_batched_tokens
    kv = KVCacheManager(num_blocks, block_size, planes, enable_prefix_caching=prefix)
    return Scheduler(cfg, kv, depth=DEPTH, shares_planes=shares, num_slots=cfg.max_num_seqs), cfg


def request(i, prompt, max_tokens, priority=0):
    r = Request(request_id=f"r{i}", prompt_token_ids=list(prompt), params=SamplingParams(priority=priority),
                arrival_index=i, row_key=i, max_tokens=max_tokens, depth_limit=DEPTH, min_loops=1, group_id=f"r{i}")
    r.metrics = RequestMetrics(arrival_time=0.0)
    return r


def samples(i, prompt, max_tokens, n):
    """The n sequences of one request with n samples (as the engine builds them)."""
    params = SamplingParams(n=n)
    group = []
    for k in range(n):
        r = Request(request_id=f"r{i}[{k}]", prompt_token_ids=list(prompt), params=params, arrival_index=i,
                    row_key=100 * i + k, max_tokens=max_tokens, depth_limit=DEPTH, min_loops=1, group_id=f"r{i}",
                    sample_index=k)
        r.metrics = RequestMetrics(arrival_time=0.0)
        group.append(r)
    return group


def apply(sched: Scheduler, out) -> list[Request]:
    """What the engine does with a step's results (every output token is 7, depth 2)."""
    done = []
    for c in out.prefills:
        r = c.request
        r.num_computed += len(c.token_ids)
        r.num_inflight -= len(c.token_ids)
        sched.publish(r)
        if c.sample:
            r.inflight_outputs -= 1
            r.output_token_ids.append(7)
            r.exit_depths.append(DEPTH)
    for r in out.decodes:
        r.num_computed += 1
        r.num_inflight -= 1
        r.inflight_outputs -= 1
        r.output_token_ids.append(7)
        r.exit_depths.append(2)
    for r in list(sched.running):
        if len(r.output_token_ids) >= r.max_tokens:
            sched.finish(r)
            done.append(r)
    return done


def test_block_pool_invariant_and_lru_eviction():
    pool = BlockPool(6)
    a = pool.allocate(2)
    pool.publish(111, tuple(a))
    pool.release(a)  # cached and idle
    assert pool.num_free == 6
    pool.check_invariant()
    hit = pool.lookup(111)
    assert hit == tuple(a) and pool.prefix_hits == 1
    pool.release(hit)
    b = pool.allocate(6)  # needs the idle cached blocks: evicted LRU-first
    assert b is not None and pool.lookup(111) is None
    pool.release(b)
    pool.check_invariant()
    assert pool.allocate(7) is None


def test_decode_rows_and_chunks_respect_budgets():
    sched, cfg = make(max_num_seqs=3, max_num_batched_tokens=8, prefill_chunk_size=5)
    for i in range(5):
        sched.add(request(i, range(100 * i, 100 * i + 11), 4))
    for _ in range(60):
        out = sched.schedule()
        assert out.num_tokens <= cfg.max_num_batched_tokens
        assert len(sched.running) <= cfg.max_num_seqs
        assert all(len(c.token_ids) <= cfg.prefill_chunk_size for c in out.prefills)
        apply(sched, out)
        sched.kv.check_invariant()
        if not sched.has_work():
            break
    assert not sched.has_work()


def test_prefix_hit_skips_cached_blocks():
    sched, _ = make(block_size=4)
    first = request(0, range(20), 1)
    sched.add(first)
    while sched.has_work():
        apply(sched, sched.schedule())
    second = request(1, list(range(16)) + [99, 98], 1)
    sched.add(second)
    out = sched.schedule()
    chunk = out.prefills[0]
    assert chunk.start == 16 and second.metrics.num_cached_tokens == 16


def _chained_digests(tokens, block_size, salt):
    """Independent reference of the prefix-cache keys: one BLAKE2b per full block over the previous
    digest, the salt and the block's ids, each packed on its own."""
    import hashlib

    out, parent = [], bytes(8)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        body = b"".join(int(t).to_bytes(8, "little", signed=True) for t in tokens[start : start + block_size])
        parent = hashlib.blake2b(parent + salt.to_bytes(8, "little", signed=True) + body, digest_size=8).digest()
        out.append(int.from_bytes(parent, "little") & ((1 << 63) - 1))
    return out


def test_prompt_block_hashes_chain_over_the_prefix_and_skip_the_last_token():
    """Cache keys of a prompt's full blocks, never of the block holding its last token (its logits
    are needed): equal to the reference, the same for the same prefix under the same salt, different
    from the first changed block on, and different under another salt."""
    kv = KVCacheManager(8, 4, 2, enable_prefix_caching=True)
    rng = random.Random(3)
    prompt = [rng.randrange(2**31) for _ in range(21)]
    hashes = kv.block_hashes(prompt, 77)
    assert hashes == _chained_digests(prompt[:20], 4, 77) and len(hashes) == 5
    assert kv.block_hashes(prompt[:20], 77) == hashes[:4]  # 20 tokens: the fifth block holds the last one
    changed = prompt[:9] + [prompt[9] + 1] + prompt[10:]
    other = kv.block_hashes(changed, 77)
    assert other[:2] == hashes[:2] and all(a != b for a, b in zip(other[2:], hashes[2:]))
    assert not set(kv.block_hashes(prompt, 78)) & set(hashes)
    assert kv.block_hashes(prompt[:4], 77) == []
    # A block's key covers the blocks before it: the same second block after another first one differs.
    assert kv.block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 0], 77)[1] != kv.block_hashes([9, 9, 9, 9, 5, 6, 7, 8, 0], 77)[1]


def test_generated_positions_never_come_from_the_prefix_cache():
    """A request re-admitted after a preemption by recompute takes only its prompt's blocks from the
    cache, even where another request's cached prompt holds its generated tokens: their K/V there
    ran at full depth (and with the prompt noise key), the request's own at its recorded depths."""
    sched, _ = make(block_size=4)
    other = request(0, list(range(12)) + [50], 1)
    sched.add(other)
    while sched.has_work():
        apply(sched, sched.schedule())
    back = request(1, range(5), 10)  # generated 5..11 and 60 before it was preempted
    back.output_token_ids = list(range(5, 12)) + [60]
    back.exit_depths = [DEPTH, 1, 2, 3, 1, 2, 3, 1]
    sched.add(back)
    out = sched.schedule()
    assert back.num_computed == 4 and out.prefills[0].start == 4  # the prompt's one full block only
    assert out.prefills[0].depths[1:] == back.exit_depths[1:]  # outputs recompute at their recorded depths


def test_n_samples_compute_the_prompt_once():
    """The samples of one request share the prompt's full blocks (prefix caching on or off): the
    first computes them, the others wait and take them, computing only the last partial block."""
    for prefix, chunked in [(True, True), (False, True), (True, False)]:
        sched, _ = make(block_size=4, max_num_batched_tokens=24 - 16 * chunked, prefill_chunk_size=8, prefix=prefix,
                        enable_chunked_prefill=chunked)
        group = samples(0, range(18), 3, n=3)
        for r in group:
            sched.add(r)
        computed = 0
        while sched.has_work():
            out = sched.schedule()
            computed += sum(len(c.token_ids) for c in out.prefills)
            apply(sched, out)
            sched.kv.check_invariant()
        assert computed == 18 + 2 * (18 - 16), (prefix, chunked)  # full blocks: 16 tokens (the last token never)
        assert [r.metrics.num_cached_tokens for r in group] == [0, 16, 16]
        assert all(len(r.output_token_ids) == 3 for r in group)


def test_without_preemption_requests_wait_for_their_whole_lifetime():
    """enable_preemption=False: admission reserves prompt + max_tokens - 1 positions on every
    plane for each running request; nothing is ever preempted and all requests finish."""
    sched, _ = make(num_blocks=3 * DEPTH, block_size=4, max_num_seqs=4, enable_preemption=False, prefix=False)
    # Prompts take one block per plane, lifetimes (3 + 6 - 1 positions) two.
    reqs = [request(i, range(10 * i, 10 * i + 3), 6) for i in range(6)]
    for r in reqs:
        sched.add(r)
    most = 0
    while sched.has_work():
        out = sched.schedule()
        assert not out.preempted
        most = max(most, len(sched.running))
        apply(sched, out)
        sched.kv.check_invariant()
        assert sched._reserved() <= sched.kv.num_free_blocks
    assert sched.num_preemptions == 0 and most == 1  # two lifetimes (16 blocks) never fit in 12
    assert all(len(r.output_token_ids) == 6 for r in reqs)


def test_bypass_bound_protects_a_blocked_request():
    # A big request that does not fit next to the running one is passed by small ones at most twice.
    sched, cfg = make(num_blocks=16, planes=1, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                      max_admission_bypasses=2, prefix=False)
    sched.add(request(0, range(20), 8))  # grows to 7 blocks
    apply(sched, sched.schedule())
    big = request(1, range(200, 248), 2)  # 12 blocks for its prompt: fits only once r0 is gone
    sched.add(big)
    for i in range(2, 8):
        sched.add(request(i, [i], 2))
    bypassed = []
    for _ in range(200):
        out = sched.schedule()
        assert big.bypass_count <= cfg.max_admission_bypasses
        bypassed.append(big.bypass_count)
        apply(sched, out)
        if not sched.has_work():
            break
    assert max(bypassed) == cfg.max_admission_bypasses
    assert not sched.has_work()


def test_unchunked_prefill_runs_whole_prompts_in_prefill_only_steps():
    sched, cfg = make(enable_chunked_prefill=False, max_num_batched_tokens=32, max_consecutive_prefill_steps=2)
    sched.add(request(0, range(10), 3))
    out = sched.schedule()
    assert len(out.prefills) == 1 and len(out.prefills[0].token_ids) == 10
    apply(sched, out)
    sched.add(request(1, range(50, 60), 3))
    out = sched.schedule()  # prefill-only step for the new prompt
    assert not out.decodes and len(out.prefills[0].token_ids) == 10
    apply(sched, out)
    sched.add(request(2, range(70, 80), 3))
    out = sched.schedule()  # two prefill-only steps in a row: now a decode step
    assert out.decodes and not out.prefills


def test_shared_layouts_prefill_one_position_per_step():
    sched, _ = make(shares=True, planes=1)
    sched.add(request(0, range(6), 1))
    out = sched.schedule()
    assert [len(c.token_ids) for c in out.prefills] == [1]


def test_priority_preempts_only_lower_priority():
    sched, cfg = make(max_num_seqs=1, scheduling_policy="priority")
    low = request(0, range(4), 10, priority=5)
    sched.add(low)
    apply(sched, sched.schedule())
    high = request(1, range(10, 14), 2, priority=0)
    sched.add(high)
    out = sched.schedule()
    assert low in out.preempted and high in out.admitted
    same = request(2, range(20, 24), 2, priority=0)
    sched.add(same)
    apply(sched, out)
    out = sched.schedule()
    assert high not in out.preempted  # equal priority never preempts


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 12), st.integers(0, 3)), min_size=1, max_size=10),
    num_blocks=st.integers(12, 80),
    max_seqs=st.integers(1, 5),
    budget=st.integers(5, 24),
    chunk=st.integers(1, 24),
    prefix=st.booleans(),
    policy=st.sampled_from(["fcfs", "priority"]),
    abort_seed=st.integers(0, 1000),
    preemption=st.booleans(),
)
def test_random_workloads_finish_without_leaks(lens, num_blocks, max_seqs, budget, chunk, prefix, policy, abort_seed,
                                               preemption):
    budget = max(budget, max_seqs)
    sched, cfg = make(num_blocks=num_blocks, block_size=4, max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                      prefill_chunk_size=chunk, prefix=prefix, scheduling_policy=policy, max_admission_bypasses=3,
                      enable_preemption=preemption)
    rng = random.Random(abort_seed)
    reqs = []
    for i, (plen, mtok, prio) in enumerate(lens):
        # Requests that can never fit are rejected by the engine before they reach the scheduler.
        need = -(-(plen + mtok) // 4) * DEPTH
        if need > num_blocks:
            continue
        prompt = [rng.randrange(8) for _ in range(plen)]
        group = samples(i, prompt, mtok, n=1 + i % 3) if prio == 3 else [request(i, prompt, mtok, priority=prio)]
        reqs += group
        for r in group:
            sched.add(r)
    aborted = set()
    for _ in range(2000):
        if not sched.has_work():
            break
        out = sched.schedule()
        assert out.num_tokens <= budget and len(sched.running) <= max_seqs
        assert all(r.bypass_count <= cfg.max_admission_bypasses for r in sched.waiting)
        apply(sched, out)
        if rng.random() < 0.05 and sched.running:
            victim = rng.choice(sched.running)
            sched.finish(victim)
            aborted.add(victim.request_id)
        sched.kv.check_invariant()
        assert len(sched.free_slots) + len(sched.running) == max_seqs
        if not preemption:
            assert not out.preempted and sched._reserved() <= sched.kv.num_free_blocks
    assert not sched.has_work(), "scheduler made no progress"
    assert sched.kv.pool.num_free == num_blocks
    for r in reqs:
        if r.request_id not in aborted:
            assert len(r.output_token_ids) == r.max_tokens


def test_a_step_writes_each_table_entry_once_with_its_last_value():
    """A slot freed and reused within one step (a preempted request's entries, then the next
    occupant's) must reach the device as one write per entry: duplicate indices in the device's
    scatter land in no defined order on the GPU (a request then read another's blocks)."""
    kv = KVCacheManager(32, 4, 2, enable_prefix_caching=False)
    assert kv.allocate("a", 1, 6)
    kv.free("a")
    assert kv.allocate("b", 1, 3)
    updates = kv.take_updates()
    keys = [(p, s, l) for p, s, l, _ in updates]
    assert len(keys) == len(set(keys))
    final = {(p, s, l): b for p, s, l, b in updates}
    for logical, planes in enumerate(kv.table("b")):
        assert all(final[(p, 1, logical)] == b for p, b in enumerate(planes))
