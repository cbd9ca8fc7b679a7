"""Seeded sampled speculation is reproducible: a request's committed tokens depend only on its own
prompt, parameters and seed — not on what the engine ran before, its batch neighbours, sync or
async scheduling, the token budget or preemption (the draft counts it takes must not either)."""

from __future__ import annotations

import pytest

from rlt_runtime import LLM, SamplingParams

ADAPTIVE = {"num_speculative_tokens": 4, "draft_loops": 1, "draft_policy": "adaptive"}

TARGET = ("t", [5, 6, 7, 8], SamplingParams(max_tokens=40, temperature=1.0, top_k=40, seed=77, ignore_eos=True))
NEIGHBOURS = [
    ("a", [9, 10], SamplingParams(max_tokens=30, temperature=0.8, seed=1, ignore_eos=True)),
    ("b", [11] * 7, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)),
    ("c", [3, 4, 5], SamplingParams(max_tokens=25, temperature=1.0, seed=5, ignore_eos=True, speculative=False)),
    ("d", list(range(40, 70)), SamplingParams(max_tokens=33, temperature=1.2, top_p=0.9, seed=8, ignore_eos=True)),
]


def make(**options) -> LLM:
    options.setdefault("async_scheduling", False)
    return LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=dict(ADAPTIVE), **options)


def drive(llm: LLM, work) -> dict:
    """work: [(name, prompt, params, arrival step)]; returns {name: (token ids, exit depths)}."""
    eng = llm.engine
    pending = sorted(work, key=lambda w: w[3])
    done, step = {}, 0
    while pending or eng.has_unfinished_requests():
        while pending and pending[0][3] <= step:
            name, prompt, params, _ = pending.pop(0)
            eng.add_request(name, prompt, params)
        for out in eng.step():
            if out.finished:
                done[out.request_id] = (out.outputs[0].token_ids, out.outputs[0].exit_depths)
        eng.check_invariants()
        step += 1
    return done


def alone(llm: LLM):
    return drive(llm, [TARGET + (0,)])["t"]


def crowded(llm: LLM, arrivals) -> dict:
    """The target among neighbours that arrive at the given steps (the target at step 2)."""
    return drive(llm, [TARGET + (2,)] + [n + (s,) for n, s in zip(NEIGHBOURS, arrivals)])


def test_the_same_request_twice_on_one_engine():
    llm = make()
    first = alone(llm)
    assert alone(llm) == first
    crowded(llm, [0, 1, 3, 5])
    assert alone(llm) == first


@pytest.mark.parametrize("arrivals", [[0, 0, 0, 0], [0, 4, 9, 2], [6, 3, 0, 1]])
def test_batch_neighbours_do_not_change_a_request(arrivals):
    reference = alone(make())
    assert crowded(make(), arrivals)["t"] == reference


def test_sync_and_async_scheduling_give_the_same_tokens():
    arrivals = [0, 4, 9, 2]
    sync, async_ = crowded(make(async_scheduling=False), arrivals), crowded(make(async_scheduling=True), arrivals)
    assert async_ == sync
    assert sync["t"] == alone(make(async_scheduling=True))


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_token_budget_and_preemption_do_not_change_a_request(mode):
    """A tight token budget (rows cannot all draft K) and a small pool (requests are preempted
    mid-generation, with rounds in flight under async scheduling)."""
    reference = crowded(make(), [0, 0, 0, 0])
    for async_mode in (False, True):
        llm = make(num_blocks=16, block_size=16, max_num_batched_tokens=5, preemption_mode=mode, async_scheduling=async_mode)
        assert crowded(llm, [0, 0, 0, 0]) == reference
        assert llm.stats()["preemptions"] > 0


def test_a_row_without_drafts_in_a_round_decodes_plainly():
    """The opted-out neighbour rides in rounds that others draft in: its tokens are plain decoding's."""
    plain = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, async_scheduling=False)
    name, prompt, params = NEIGHBOURS[2]
    expected = drive(plain, [(name, prompt, params, 0)])[name]
    llm = make()
    assert crowded(llm, [0, 1, 0, 0])[name] == expected
    assert llm.stats()["speculative"]["rounds"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("execution_mode", ["eager", "graphs"])
def test_reproducible_on_the_gpu(execution_mode):
    """On CUDA (bf16, graph buckets padded to the batch, async scheduling by default): the target
    alone, among neighbours, a second time on the same engine and in sync mode commits the same
    tokens."""
    def gpu(**options):
        return LLM("ouro-tiny", device="cuda", dtype="bfloat16", max_num_seqs=4, gpu_memory_utilization=0.08,
                   execution_mode=execution_mode, speculative_config=dict(ADAPTIVE), **options)

    llm = gpu()
    reference = drive(llm, [TARGET + (0,)])["t"]
    assert crowded(llm, [0, 4, 9, 2])["t"] == reference
    assert drive(llm, [TARGET + (0,)])["t"] == reference
    assert crowded(gpu(async_scheduling=False), [6, 3, 0, 1])["t"] == reference
