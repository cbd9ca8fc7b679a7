"""Self-speculative decoding: greedy outputs bitwise equal to plain decoding, sampled outputs
distributed as the target, and a clean request lifecycle around rounds in flight."""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlt_runtime import LLM, ConfigError, SamplingParams
from workload import run_workload


@functools.lru_cache(maxsize=None)
def engine(**options) -> LLM:
    """Engines are cached per option set (speculative_config passed as a tuple of items)."""
    if isinstance(options.get("speculative_config"), tuple):
        options["speculative_config"] = dict(options["speculative_config"])
    return LLM("ouro-tiny", dtype="float32", max_num_seqs=4, **options)


def spec(k=3, d=1, policy="fixed"):
    return {"num_speculative_tokens": k, "draft_loops": d, "draft_policy": policy}


def run(llm: LLM, work, params: SamplingParams):
    """{index: (token ids, exit depths, finish reason)} of a staggered-arrival workload."""
    return {i: (c.token_ids, c.exit_depths, c.finish_reason) for i, c in run_workload(llm, work, params).items()}


workloads = st.lists(st.tuples(st.lists(st.integers(3, 300), min_size=1, max_size=24), st.integers(0, 3)),
                     min_size=1, max_size=5)


@settings(max_examples=14, deadline=None)
@given(
    work=workloads,
    k=st.integers(1, 4),
    d=st.integers(1, 3),
    policy=st.sampled_from(["fixed", "adaptive"]),
    threshold=st.sampled_from([1.0, 0.6]),
    async_mode=st.booleans(),
    pool=st.sampled_from([None, 24]),
    swap=st.booleans(),
    prefix=st.booleans(),
    chunk=st.sampled_from([2, 64]),
    stop=st.booleans(),
)
# A step whose only work was swapping a preempted request back in used to be skipped, losing the
# copies, its block-table updates and its slot state.
@example(work=[([3], 0), ([3, 3, 3], 0), ([3, 3, 3], 0), ([3, 3, 12], 0), ([3], 0)], k=1, d=1, policy="fixed",
         threshold=0.6, async_mode=True, pool=24, swap=True, prefix=False, chunk=2, stop=False)
def test_greedy_speculation_is_bitwise_identical(work, k, d, policy, threshold, async_mode, pool, swap, prefix, chunk,
                                                 stop):
    common = dict(num_blocks=pool, block_size=16, enable_prefix_caching=prefix, prefill_chunk_size=chunk,
                  max_num_batched_tokens=16, preemption_mode="swap" if swap else "recompute")
    params = SamplingParams(max_tokens=14, temperature=0, exit_threshold=threshold, ignore_eos=True,
                            stop_token_ids=[133, 219] if stop else None)
    plain = run(engine(**common), work, params)
    fast = run(engine(speculative_config=tuple(spec(k, d, policy).items()), async_scheduling=async_mode, **common),
               work, params)
    assert fast == plain


@pytest.mark.parametrize("async_mode", [False, True])
def test_speculation_without_preemption_reserves_its_drafts(async_mode):
    """enable_preemption=False: admission reserves a request's lifetime plus one round of drafts in
    flight (async rounds allocate from an upper bound of the position), so rounds never run out of
    blocks and nothing is preempted; outputs equal plain decoding."""
    work = [(list(range(5 + 9 * i, 15 + 9 * i)), 0) for i in range(5)]  # 10-token prompts, all at once
    # 10 + 23 - 1 = 32 positions fill two blocks exactly; the 3 drafts of a round in flight need a third.
    params = SamplingParams(max_tokens=23, temperature=0, ignore_eos=True)
    # 16 blocks hold two lifetimes of 2 blocks x 4 planes, but only one with the drafts' third block.
    common = dict(num_blocks=16, block_size=16, max_num_batched_tokens=16, enable_preemption=False)
    plain = run(engine(**common), work, params)
    llm = engine(speculative_config=tuple(spec(3, 1).items()), async_scheduling=async_mode, **common)
    assert run(llm, work, params) == plain
    assert llm.stats()["preemptions"] == 0 and llm.stats()["speculative"]["rounds"] > 0


def test_speculation_is_used_and_counted():
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=spec(3, 2))
    llm.generate([[5, 6, 7], [9, 10]], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True), use_tqdm=False)
    st_ = llm.stats()["speculative"]
    assert st_["rounds"] > 0 and st_["drafted"] > 0 and st_["committed"] >= st_["rounds"]
    assert sum(st_["chosen_k"].values()) >= st_["rounds"]
    assert len(st_["accepted_per_position"]) == 3


def test_rounds_draft_only_what_their_rows_can():
    """A round's draft count is the most any of its rows drafts: rows that opted out make plain
    decode steps (no round counted), and a row near max_tokens makes a shorter round."""
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=spec(3, 1))
    spec_runner, rounds = llm.engine.executor.worker.runner.spec, []
    run_round = spec_runner.run_round

    def recorded(requests, num_drafts, traces, k, *rest):
        rounds.append((k, list(num_drafts)))
        return run_round(requests, num_drafts, traces, k, *rest)

    spec_runner.run_round = recorded
    greedy = dict(temperature=0, ignore_eos=True)
    llm.generate(["abc"], SamplingParams(max_tokens=8, speculative=False, **greedy), use_tqdm=False)
    assert rounds == [] and llm.stats()["speculative"]["rounds"] == 0
    llm.generate(["abc"], SamplingParams(max_tokens=4, **greedy), use_tqdm=False)
    assert rounds and all(k == max(drafts) > 0 for k, drafts in rounds)
    assert rounds[0][0] == 2  # three tokens left after the first: two drafts at most
    assert llm.stats()["speculative"]["rounds"] == len(rounds)


def test_per_request_opt_out_matches_plain():
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=spec(3, 1))
    p = SamplingParams(max_tokens=10, temperature=0.9, seed=4, ignore_eos=True, speculative=False)
    plain = LLM("ouro-tiny", dtype="float32", max_num_seqs=4).generate(["abc"], p, use_tqdm=False)[0]
    opted = llm.generate(["abc"], p, use_tqdm=False)[0]
    assert plain.outputs[0].token_ids == opted.outputs[0].token_ids


def _joint(llm, n):
    params = [SamplingParams(max_tokens=3, temperature=0.7, top_k=4, seed=s, ignore_eos=True) for s in range(n)]
    outs = llm.generate([[11, 12, 13]] * n, params, use_tqdm=False)
    return Counter(tuple(o.outputs[0].token_ids[1:3]) for o in outs)


def test_sampled_speculation_preserves_the_target_distribution():
    n = 500
    plain = _joint(LLM("ouro-tiny", dtype="float32", max_num_seqs=16), n)
    fast = _joint(LLM("ouro-tiny", dtype="float32", max_num_seqs=16, speculative_config=spec(3, 1)), n)
    # Two-sample chi-square over the joint (token 2, token 3) cells seen at least 10 times in total.
    cells = [c for c in set(plain) | set(fast) if plain[c] + fast[c] >= 10]
    chi2 = sum((plain[c] - fast[c]) ** 2 / (plain[c] + fast[c]) for c in cells)
    dof = max(1, len(cells) - 1)
    assert chi2 < dof + 4 * (2 * dof) ** 0.5, (chi2, dof)


def test_sampled_speculation_is_reproducible_per_seed():
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=spec(3, 1))
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=77, ignore_eos=True)
    a = llm.generate(["same"], p, use_tqdm=False)[0].outputs[0].token_ids
    b = llm.generate(["other", "same"], p, use_tqdm=False)[1].outputs[0].token_ids
    assert a == b


def test_max_tokens_and_stop_inside_a_round():
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=spec(4, 2))
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 3 and out.outputs[0].finish_reason == "length"


@pytest.mark.parametrize("async_mode", [False, True])
def test_abort_and_id_reuse_with_rounds_in_flight(async_mode):
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=spec(3, 1), async_scheduling=async_mode)
    eng = llm.engine
    p = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    eng.add_request("x", [5, 6, 7], p)
    eng.add_request("y", [8, 9], p)
    for _ in range(4):
        eng.step()
    eng.abort_request("x")
    eng.add_request("x", [5, 6, 7], p)  # same id, new request, while the old one's round may be in flight
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    eng.check_invariants()
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks
    fresh = LLM("ouro-tiny", dtype="float32", max_num_seqs=4).generate([[5, 6, 7]], p, use_tqdm=False)[0]
    assert done["x"] == fresh.outputs[0].token_ids and len(done["y"]) == 30


def test_trace_with_async_speculation_is_rejected():
    with pytest.raises(ConfigError, match="async_scheduling"):
        LLM("ouro-tiny", exit_mode="trace", exit_trace={"a": [4]}, async_scheduling=True, speculative_config=spec())


class PaddingOnly:
    """Stands in for the CUDA-graph manager on CPU: pads every step to a bucket, runs eagerly."""

    def __init__(self, size):
        self.size = size

    def bucket(self, rows):
        return self.size

    def run(self, rows, variant):
        return None


@pytest.mark.parametrize("threshold", [0.6, 1.0], ids=["early-exit", "fixed-depth"])
@pytest.mark.parametrize("with_spec", [False, True])
def test_padded_rows_are_inert(with_spec, threshold):
    """Rows padded to a bucket change nothing, also in fixed-depth steps (threshold 1.0), whose
    linear layers and norms compute the padding rows (they take no live count)."""
    options = {"speculative_config": spec(3, 1)} if with_spec else {}
    params = SamplingParams(max_tokens=10, temperature=0.7, seed=9, exit_threshold=threshold, logprobs=2,
                            ignore_eos=True)
    prompts = [[5, 6, 7], [8, 9], list(range(20, 40))]
    plain = LLM("ouro-tiny", dtype="float32", max_num_seqs=8, **options)
    padded = LLM("ouro-tiny", dtype="float32", max_num_seqs=8, **options)
    padded.engine.executor.worker.runner.graphs = PaddingOnly(8)
    padded.engine.executor.worker.runner.prefill_graphs = PaddingOnly(padded.engine.max_num_batched_tokens)
    if with_spec:
        padded.engine.executor.worker.runner.spec.graphs = PaddingOnly(8)
    a = plain.generate(prompts, params, use_tqdm=False)
    b = padded.generate(prompts, params, use_tqdm=False)
    assert [(o.outputs[0].token_ids, o.outputs[0].exit_depths, [lp.logprob for lp in o.outputs[0].logprobs]) for o in a] == \
           [(o.outputs[0].token_ids, o.outputs[0].exit_depths, [lp.logprob for lp in o.outputs[0].logprobs]) for o in b]
    padded.engine.check_invariants()


class CaptureWarmUp(PaddingOnly):
    """Stands in for a lazy CUDA-graph capture on CPU: before the eager run, the program runs once
    with its live-row counts zeroed (as a capture's warm-up does), when no kernel writes any row."""

    def __init__(self, size, program, inert):
        super().__init__(size)
        self.program, self.inert = program, inert

    def run(self, rows, variant):
        saved = [t.clone() for t in self.inert]
        for t in self.inert:
            t.zero_()
        self.program(self.size, *variant)
        for t, v in zip(self.inert, saved):
            t.copy_(v)
        return None


def test_rounds_pass_only_in_range_ids_to_kernels_when_no_row_is_written():
    """A round graph captured for a logprobs request warmed up with zero live rows: acceptance then
    writes no row and its unwritten outputs (poisoned here, as device memory can be) must not reach
    the logprobs kernel as token ids (an illegal memory access on the GPU)."""
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=8, speculative_config=spec(3, 1))
    runner = llm.engine.executor.worker.runner
    vocab = runner.cfg.vocab_size
    inp = runner.spec.inp
    runner.spec.graphs = CaptureWarmUp(8, runner.spec.round_program, [inp["num_rows"], inp["num_verify"], inp["counts"]])
    ops = runner.ops
    accept, logprobs = ops.accept_draft, ops.compute_logprobs

    def poisoned_accept(*args, active_rows=None, **kw):
        tokens, accepted = accept(*args, active_rows=active_rows, **kw)
        unwritten = torch.arange(tokens.shape[0]) >= active_rows
        return tokens.masked_fill(unwritten[:, None], 1 << 40), accepted

    def checked_logprobs(logits, tokens, num_top):
        assert bool(((tokens >= 0) & (tokens < vocab)).all()), tokens
        return logprobs(logits, tokens, num_top)

    ops.accept_draft, ops.compute_logprobs = poisoned_accept, checked_logprobs
    params = SamplingParams(max_tokens=12, temperature=0.9, seed=11, logprobs=2, ignore_eos=True)
    out = llm.generate([[5, 17, 3, 42, 8, 11, 60, 2, 9]], params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 12 and all(lp.logprob > float("-inf") for lp in out.logprobs)


def own_writes_only(rope_kv_scatter, paged_attention):
    """`rope_paged_attention` as a fused GPU launch may run it: each row's program sees its own K/V
    write, but another program's write of the same launch only if that program got there first;
    here never. A row that reads a key another row of the launch writes gets the key's old
    contents; rows that read only their own sequence's keys get the bits of the two ops in turn."""
    def call(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, seq_lens, query_start_loc, *,
             style="neox", q_bias=None, k_bias=None, k_scale=None, v_scale=None, active_seqs=None, **attention_kwargs):
        scales = {} if k_scale is None else dict(k_scale=k_scale, v_scale=v_scale)
        live = q.shape[0] if active_seqs is None else min(int(active_seqs[0]), q.shape[0])
        written = slot_mapping[:live][slot_mapping[:live] >= 0]
        blocks, offsets = written // k_cache.shape[1], written % k_cache.shape[1]
        old_k, old_v = k_cache[blocks, offsets].clone(), v_cache[blocks, offsets].clone()
        q_rot = rope_kv_scatter(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, style=style,
                                q_bias=q_bias, k_bias=k_bias, active_rows=active_seqs, **scales)
        new_k, new_v = k_cache[blocks, offsets].clone(), v_cache[blocks, offsets].clone()

        def attend():
            return paged_attention(q_rot, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                                   active_seqs=active_seqs, decode_from=0, **scales, **attention_kwargs)

        out = attend()
        for i in range(live):  # row i with only its own write done
            mine = (written == slot_mapping[i])[:, None, None]
            k_cache[blocks, offsets] = torch.where(mine, new_k, old_k)
            v_cache[blocks, offsets] = torch.where(mine, new_v, old_v)
            out[i] = attend()[i]
        k_cache[blocks, offsets], v_cache[blocks, offsets] = new_k, new_v
        return out

    return call


@pytest.mark.parametrize("model", ["ouro-tiny", "huginn-tiny"])
def test_verify_rows_never_attend_in_a_launch_that_writes_their_keys(model):
    """A verify pass's rows of one request read each other's keys (draft j attends to drafts before
    it), so each loop must write every row's K/V before any row attends (a fused decode launch
    orders only a program's own write before its reads: on a busy GPU, rows read the old keys and
    greedy rounds drift from plain decoding). Huginn's coda attends in the verify pass too."""
    params = SamplingParams(max_tokens=10, temperature=0, logprobs=1, ignore_eos=True)
    prompts = [[5, 6, 7, 9], [8, 9], list(range(20, 37))]
    plain = LLM(model, dtype="float32", max_num_seqs=4)
    fast = LLM(model, dtype="float32", max_num_seqs=4, speculative_config=spec(3, 1))
    outputs = []
    for llm in (plain, fast):
        ops = llm.engine.executor.worker.runner.ops
        ops.rope_paged_attention = own_writes_only(ops.rope_kv_scatter, ops.paged_attention)
        done = llm.generate(prompts, params, use_tqdm=False)
        outputs.append([(c.token_ids, [lp.logprob for lp in c.logprobs]) for o in done for c in o.outputs])
    assert outputs[1] == outputs[0]
    assert fast.stats()["speculative"]["drafted"] > 0


def test_speculation_with_plane_sharing_layouts_is_rejected():
    """Where loops share planes a draft cannot be verified in one pass (token j's loop 0 reads token
    j-1's last loop): the engine says so instead of committing tokens plain decoding would not."""
    with pytest.raises(ConfigError, match="kv_layout='shared'"):
        LLM("ouro-tiny", kv_layout="shared", speculative_config=spec())
    with pytest.raises(ConfigError, match="kv_layout='compress-s4'"):
        LLM("huginn-tiny", kv_layout="compress-s4", num_loops=8, speculative_config=spec(d=2))


@pytest.mark.parametrize("async_mode", [False, True])
def test_greedy_rows_stop_drafting_in_crowded_steps(async_mode):
    """speculative_config.disable_by_batch_size: while more requests than that are in the engine,
    greedy rows draft none while a seeded sampled row keeps drafting; once few enough remain, greedy
    rows draft again. Greedy tokens equal plain decoding, and the sampled row's equal what it
    commits alone (its counts never depend on the batch)."""
    config = dict(spec(3, 1, "fixed"), disable_by_batch_size=2)
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=config, async_scheduling=async_mode)
    spec_runner, rounds = llm.engine.executor.worker.runner.spec, []
    run_round = spec_runner.run_round

    def recorded(requests, num_drafts, *rest, **kw):
        rounds.append([(r.greedy, k) for r, k in zip(requests, num_drafts)])
        return run_round(requests, num_drafts, *rest, **kw)

    spec_runner.run_round = recorded
    greedy = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (6, 8, 30)]
    sampled = SamplingParams(max_tokens=30, temperature=0.8, seed=7, ignore_eos=True)
    prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14], [15, 16]]
    outs = llm.generate(prompts, greedy + [sampled], use_tqdm=False)
    plain = LLM("ouro-tiny", dtype="float32", max_num_seqs=4).generate(prompts[:3], greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs[:3]] == [o.outputs[0].token_ids for o in plain]
    alone = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=config).generate(
        prompts[3:], [sampled], use_tqdm=False)[0]
    assert outs[3].outputs[0].token_ids == alone.outputs[0].token_ids
    crowded = [r for r in rounds if len(r) > 2]
    assert crowded and all(k == 0 for r in crowded for is_greedy, k in r if is_greedy)
    assert any(k > 0 for r in crowded for is_greedy, k in r if not is_greedy)
    assert any(k > 0 for r in rounds if len(r) <= 2 for is_greedy, k in r if is_greedy)


@pytest.mark.parametrize("async_mode", [False, True])
def test_greedy_rows_draft_what_the_round_runs(async_mode):
    """Adaptive drafts in a small batch: a greedy row drafts as many as the round runs for its
    other rows (its own estimate may pick fewer; the round's cost is set by its largest count),
    seeded sampled rows keep their own counts, so their tokens equal their runs alone
    (test_greedy_speculation_is_bitwise_identical checks greedy tokens against plain decoding with
    the adaptive policy)."""
    config = spec(4, 1, "adaptive")
    rounds = []

    def engine(prompts, params):
        llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=config, async_scheduling=async_mode)
        spec_runner = llm.engine.executor.worker.runner.spec
        run_round, log = spec_runner.run_round, []

        def recorded(requests, num_drafts, *rest, **kw):
            log.append([(r.greedy, k) for r, k in zip(requests, num_drafts)])
            return run_round(requests, num_drafts, *rest, **kw)

        spec_runner.run_round = recorded
        rounds.append(log)
        return llm.generate(prompts, params, use_tqdm=False)

    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    sampled = [SamplingParams(max_tokens=40, temperature=0.8, seed=s, ignore_eos=True) for s in (11, 12)]
    prompts = [[5, 6, 7], [9, 10, 11, 12], [13, 14], [15, 16, 17]]
    outs = engine(prompts, [greedy, greedy] + sampled)
    for i in (2, 3):
        assert outs[i].outputs[0].token_ids == engine(prompts[i:i + 1], sampled[i - 2:i - 1])[0].outputs[0].token_ids
    crowd = rounds[0]
    early = [r for r in crowd[:12] if len(r) == 4]  # every row far from max_tokens
    assert early and all(k == max(kk for _, kk in r) for r in early for is_greedy, k in r if is_greedy)
    assert any(k < max(kk for _, kk in r) for r in early for is_greedy, k in r if not is_greedy)


def test_greedy_rows_take_the_count_that_pays_for_the_round():
    """Eight greedy rows at synthetic acceptance 0.7 with d = 2 of D = 4 (by the static round cost,
    which the CPU engine keeps for want of device times, one draft pays and two do not): once their
    estimates settle the round runs one draft, deeper only in an occasional probe. Each row's own
    choice, maxed over the batch as before `greedy_rounds`, ran most of these rounds at 2 or more.
    (Synthetic acceptance makes the tokens not the model's; test_greedy_speculation_is_bitwise_identical
    checks the adaptive policy's greedy tokens against plain decoding.)"""
    config = dict(spec(4, 2, "adaptive"), synthetic_acceptance=0.7)
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=8, speculative_config=config)
    spec_runner, counts = llm.engine.executor.worker.runner.spec, []
    run_round = spec_runner.run_round

    def recorded(requests, num_drafts, *rest, **kw):
        counts.append(max(num_drafts))
        return run_round(requests, num_drafts, *rest, **kw)

    spec_runner.run_round = recorded
    params = SamplingParams(max_tokens=120, temperature=0, ignore_eos=True)
    prompts = [[5 + i, 6, 7 + 2 * i] for i in range(8)]
    llm.generate(prompts, params, use_tqdm=False)
    settled = counts[len(counts) // 3:]
    assert sum(k == 1 for k in settled) >= 0.8 * len(settled), counts


def test_waiting_requests_count_toward_disable_by_batch_size():
    """The limit counts requests waiting for admission too (vLLM's count): one running row with two
    more queued behind it (max_num_seqs=1, limit 2) drafts none; once at most two requests are in
    the engine, rows draft. Tokens equal plain decoding."""
    config = dict(spec(3, 1, "fixed"), disable_by_batch_size=2)
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=1, speculative_config=config)
    spec_runner, queued = llm.engine.executor.worker.runner.spec, []  # requests in the engine at each round
    run_round, scheduler = spec_runner.run_round, llm.engine.scheduler

    def recorded(requests, num_drafts, *rest, **kw):
        queued.append(len(scheduler.running) + len(scheduler.waiting))
        return run_round(requests, num_drafts, *rest, **kw)

    spec_runner.run_round = recorded
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
    outs = llm.generate(prompts, params, use_tqdm=False)
    plain = LLM("ouro-tiny", dtype="float32", max_num_seqs=1).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    assert queued and max(queued) <= 2


def test_disable_by_batch_size_is_validated():
    with pytest.raises(ConfigError, match="disable_by_batch_size"):
        LLM("ouro-tiny", dtype="float32", speculative_config=dict(spec(), disable_by_batch_size=0))
