"""Data parallelism: routing, replica devices, bitwise equality with one engine, aborts, failures.

The reference for every output is a single LLMEngine given the same requests: batch invariance
and arrival-keyed randomness make each request's tokens, log-probabilities and exit depths
independent of which replica runs it and of its neighbours there.
"""

from __future__ import annotations

import functools
import os
import signal

import pytest
import torch

from rlt_runtime import ConfigError, EngineConfig, LLM, SamplingParams
from rlt_runtime.engine.data_parallel import DataParallelEngine, replica_devices
from rlt_runtime.engine.llm_engine import LLMEngine
from rlt_runtime.engine.routing import Router
from rlt_runtime.engine.wire import output_from_dict, output_to_dict, params_from_dict, params_to_dict
from rlt_runtime.errors import ReplicaError
from rlt_runtime.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
from workload import fail_after_steps

OPTIONS = dict(dtype="float32", device="cpu", max_num_seqs=4, num_blocks=256, max_model_len=128)


# ---- routing ---------------------------------------------------------------------------------------
def test_router_sends_to_least_outstanding_work():
    router = Router(3, block_size=4)
    router.add(0, 50)
    router.add(1, 10)
    router.add(2, 30)
    assert router.choose([1, 2], [True, True, True]) == 1  # shorter than a block: no affinity
    router.add(1, 100)
    assert router.choose([1, 2], [True, True, True]) == 2
    assert router.choose([1, 2], [True, True, False]) == 0  # a failed replica never takes work
    router.add(0, -50)
    router.add(2, -30)
    assert router.choose([3], [True, True, True]) == 0  # ties: the lowest index


def test_router_keeps_a_prefix_on_its_replica_within_the_slack():
    router = Router(2, block_size=4, affinity_slack=100)
    shared = [5, 6, 7, 8]
    first = router.choose(shared + [1], [True, True])
    assert first == 0
    router.add(0, 80)  # replica 0 is busier but within the slack: the prefix stays
    assert router.choose(shared + [2, 3], [True, True]) == 0
    assert router.choose([9, 9, 9, 9, 1], [True, True]) == 1  # another first block: least work
    router.add(0, 100)  # now 180 > 0 + 100: the prefix moves to replica 1 and stays there
    assert router.choose(shared + [4], [True, True]) == 1
    router.add(0, -180)
    assert router.choose(shared + [5], [True, True]) == 1
    assert router.choose(shared, [True, False]) == 0  # its home failed: the others take it
    assert router.choose([5, 6, 7, 1, 8], [True, True]) == 0  # differs inside the first block


def test_router_forgets_the_oldest_prefixes():
    router = Router(2, block_size=2, affinity_slack=1000, max_prefixes=1)
    assert router.choose([1, 1], [True, True]) == 0
    router.add(0, 10)
    assert router.choose([1, 1, 5], [True, True]) == 0  # remembered: affinity beats least work
    assert router.choose([2, 2], [True, True]) == 1  # the one remembered prefix is now [2, 2]
    assert router.choose([1, 1], [True, True]) == 1  # [1, 1] forgotten: least work decides


# ---- what crosses to a replica ---------------------------------------------------------------------------
def test_requests_and_outputs_cross_as_plain_data_and_come_back_equal():
    params = SamplingParams(n=2, best_of=3, max_tokens=5, temperature=0.7, seed=9, stop=["x", "yz"], logprobs=2,
                            prompt_logprobs=1, logit_bias={3: -1.5}, bad_words=["no", [4, 5]], min_tokens=1,
                            guided={"regex": "[ab]+"}, allowed_token_ids=[3, 4, 9], truncate_prompt_tokens=7,
                            truncation_side="right", thinking_token_budget=4,
                            repetition_detection={"max_pattern_size": 3, "min_count": 2})
    data = params_to_dict(params)
    assert _plain(data) and params_from_dict(data) == params
    out = RequestOutput("r", "hi", [1, 2], [CompletionOutput(
        0, "ab", [3, 4], [2, 4], "stop", [TokenLogprob(-0.25, {3: -0.25, 7: -1.0}), TokenLogprob(-1e-9, {})], "b",
        -0.250000001)], True, RequestMetrics(1.5, 1.6, 1.7, 1.8, 2, 0, 6, 0),
        [None, TokenLogprob(-2.0, {1: -0.5})], error=None)
    data = output_to_dict(out)
    assert _plain(data) and output_from_dict(data) == out


def _plain(value) -> bool:
    """Only builtin values: what any transport (pipes, Ray, JSON with int keys restored) carries."""
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


# ---- options ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_data_parallel_size_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match="data_parallel_size"):
        EngineConfig(data_parallel_size=bad).validate_static()


def test_replica_devices(monkeypatch):
    assert replica_devices(EngineConfig(device="cpu", data_parallel_size=3)) == ["cpu"] * 3
    with pytest.raises(ConfigError, match="data_parallel_size"):
        replica_devices(EngineConfig(device="cuda:1", data_parallel_size=2))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert replica_devices(EngineConfig(device="auto", data_parallel_size=2)) == ["cpu", "cpu"]
    with pytest.raises(ConfigError, match=r"data_parallel_size \(2\) x tensor_parallel_size \(1\) must be at most "
                                          r"the number of CUDA devices \(0\)"):
        replica_devices(EngineConfig(device="cuda", data_parallel_size=2))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert replica_devices(EngineConfig(device="auto", data_parallel_size=2)) == ["cuda:0", "cuda:1"]
    with pytest.raises(ConfigError, match=r"data_parallel_size \(3\) x .* at most the number of CUDA devices \(2\)"):
        replica_devices(EngineConfig(device="auto", data_parallel_size=3))


def test_recording_an_exit_trace_needs_one_engine(tmp_path):
    with pytest.raises(ConfigError, match="record_exit_trace cannot be combined with data_parallel_size > 1"):
        DataParallelEngine("ouro-tiny", data_parallel_size=2, record_exit_trace=str(tmp_path / "t.json"), **OPTIONS)


def test_a_single_engine_refuses_data_parallel_size():
    with pytest.raises(ConfigError, match="data_parallel_size=2"):
        LLMEngine("ouro-tiny", data_parallel_size=2, **OPTIONS)


# ---- bitwise equality with one engine ----------------------------------------------------------------
def _workload():
    """Prompts (two share a first block) and a mix of greedy, seeded, unseeded and n=2 requests."""
    shared = list(range(3, 19))  # one full 16-token block
    prompts = [shared + [40, 41], [7, 8, 9, 10, 11], shared + [50], list(range(60, 90)), [2, 3], shared + [70, 71, 72],
               [100 + i for i in range(20)], [5]]
    params = [
        SamplingParams(max_tokens=10, temperature=0, logprobs=3, ignore_eos=True, exit_threshold=0.6),
        SamplingParams(max_tokens=8, temperature=1.0, seed=11, logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, logprobs=1, ignore_eos=True),  # unseeded
        SamplingParams(max_tokens=7, temperature=1.0, seed=3, n=2, logprobs=2, ignore_eos=True, exit_threshold=0.5),
        SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=1.2, top_k=20, seed=5, logprobs=0, ignore_eos=True),
        SamplingParams(max_tokens=5, temperature=0, logprobs=2, ignore_eos=True, max_loops=2),
        SamplingParams(max_tokens=9, temperature=0.7, logprobs=1, ignore_eos=True),  # unseeded
    ]
    return prompts, params


def _run(engine, prompts, params) -> dict:
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(f"q{i}", prompt, p)
    return _finish_all(engine)


def _signature(out):
    """Everything a request's result is: tokens, exit depths, logprobs with their top-N, text."""
    return [(c.index, c.token_ids, c.exit_depths, c.finish_reason, c.text, c.cumulative_logprob,
             None if c.logprobs is None else [(lp.logprob, sorted(lp.top.items())) for lp in c.logprobs])
            for c in out.outputs]


@functools.lru_cache(maxsize=None)
def _reference(model: str, speculative_tokens: int = 0) -> dict:
    spec = {"speculative_config": {"num_speculative_tokens": speculative_tokens}} if speculative_tokens else {}
    prompts, params = _workload()
    return {rid: _signature(out) for rid, out in _run(LLMEngine(model, **OPTIONS, **spec), prompts, params).items()}


@pytest.mark.parametrize("model", ["ouro-tiny", "huginn-tiny"])
def test_in_process_replicas_match_one_engine_bit_for_bit(model):
    engine = DataParallelEngine(model, data_parallel_size=2, backend="inprocess", **OPTIONS)
    prompts, params = _workload()
    done = _run(engine, prompts, params)
    assert {rid: _signature(out) for rid, out in done.items()} == _reference(model)
    per = engine.stats()["data_parallel"]["replicas"]
    assert all(r["stats"]["steps"] > 0 for r in per), "both replicas must have run requests"
    assert engine.stats()["prefix_cache_hits"] > 0  # the shared first block went to one replica


def test_delta_outputs_of_replicas_add_up_to_one_engines_outputs():
    """The server asks for deltas: cut from the replicas' whole outputs, merged back, they equal
    one engine's (a delta repeating or dropping tokens, text or logprobs breaks this)."""
    from rlt_runtime.outputs import OutputAccumulator

    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, backend="inprocess", **OPTIONS)
    prompts, params = _workload()
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(f"q{i}", prompt, p)
    merged, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step(deltas=True):
            merged.setdefault(out.request_id, OutputAccumulator()).add(out)
        steps += 1
    assert steps > 3
    assert {rid: _signature(acc.output) for rid, acc in merged.items()} == _reference("ouro-tiny")


def test_speculative_replicas_match_one_speculative_engine_and_sum_their_counts():
    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, backend="inprocess",
                                speculative_config={"num_speculative_tokens": 2}, **OPTIONS)
    prompts, params = _workload()
    done = _run(engine, prompts, params)
    assert {rid: _signature(out) for rid, out in done.items()} == _reference("ouro-tiny", 2)
    stats = engine.stats()
    per = [r["stats"]["speculative"] for r in stats["data_parallel"]["replicas"]]
    assert all(p["rounds"] > 0 for p in per)
    for key in ("rounds", "drafted", "accepted"):
        assert stats["speculative"][key] == sum(p[key] for p in per)
    assert stats["speculative"]["drafted_per_position"] == [a + b for a, b in zip(*(p["drafted_per_position"] for p in per))]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["ouro-tiny", "huginn-tiny"])
def test_replica_processes_match_one_engine_bit_for_bit(model):
    llm = LLM(model, data_parallel_size=2, **OPTIONS)
    try:
        prompts, params = _workload()
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert {f"q{i}": _signature(out) for i, out in enumerate(outs)} == _reference(model)
        stats = llm.stats()
        assert stats["data_parallel"]["alive"] == 2
        assert all(r["stats"]["steps"] > 0 and r["alive"] for r in stats["data_parallel"]["replicas"])
        assert stats["steps"] == sum(r["stats"]["steps"] for r in stats["data_parallel"]["replicas"])
        assert stats["prefix_cache_hits"] > 0
    finally:
        llm.engine.shutdown()


def test_a_shared_prefix_follows_its_replica_and_hits_its_cache():
    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, backend="inprocess", **OPTIONS)
    shared = list(range(20, 52))  # two full blocks
    engine.add_request("first", shared + [1], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    engine.step()  # its prompt is computed and its blocks published
    engine.add_request("second", shared + [2, 3], SamplingParams(max_tokens=2, temperature=0))
    assert _replica_stats(engine, "outstanding_requests") == [2, 0]  # least work alone would pick replica 1
    engine.add_request("other", list(range(60, 80)), SamplingParams(max_tokens=2, temperature=0))
    assert _replica_stats(engine, "outstanding_requests") == [2, 1]
    _finish_all(engine)
    assert _replica_stats(engine, "prefix_cache_hits") == [2, 0]


# ---- aborts and failures -----------------------------------------------------------------------------
LONG = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
SHORT_PROMPTS = [[10 + i] * 3 for i in range(4)]  # shorter than a block: routed by work alone -> 0, 1, 0, 1


def _replica_stats(engine, key):
    return [r["stats"][key] if key in r["stats"] else r[key] for r in engine.stats()["data_parallel"]["replicas"]]


def _finish_all(engine) -> dict:
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def test_abort_reaches_the_replica_that_runs_the_request():
    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, backend="inprocess", **OPTIONS)
    for i, prompt in enumerate(SHORT_PROMPTS):
        engine.add_request(f"a{i}", prompt, LONG)
    assert _replica_stats(engine, "outstanding_requests") == [2, 2]
    engine.step()
    engine.step()
    assert _replica_stats(engine, "running") == [2, 2]
    for rid in ("a0", "a1"):  # one on each replica
        out = engine.abort_request(rid)
        assert out.finished and out.outputs[0].finish_reason == "abort" and len(out.outputs[0].token_ids) < 40
    assert _replica_stats(engine, "running") == [1, 1]
    assert engine.abort_request("a0") is None and engine.abort_request("nope") is None
    done = _finish_all(engine)
    assert sorted(done) == ["a2", "a3"] and all(len(o.outputs[0].token_ids) == 40 for o in done.values())
    assert _replica_stats(engine, "outstanding_work") == [0, 0]
    for r in engine.replicas:
        r.engine.check_invariants()
        assert r.engine.kv.pool.num_free == r.engine.kv.pool.num_blocks


def test_a_failed_replica_errors_its_requests_and_the_others_keep_serving():
    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, backend="inprocess", **OPTIONS)
    fail_after_steps(engine.replicas[1].engine, 2)
    for i, prompt in enumerate(SHORT_PROMPTS):
        engine.add_request(f"f{i}", prompt, LONG)
    done = _finish_all(engine)
    for rid in ("f1", "f3"):  # replica 1's
        out = done[rid]
        assert out.error is not None and "replica 1" in out.error and "device lost" in out.error
        assert out.outputs[0].finish_reason == "error" and 0 < len(out.outputs[0].token_ids) < 40
    for rid in ("f0", "f2"):
        assert done[rid].error is None and done[rid].outputs[0].finish_reason == "length"
    stats = engine.stats()["data_parallel"]
    assert stats["alive"] == 1 and [r["alive"] for r in stats["replicas"]] == [True, False]
    assert "device lost" in stats["replicas"][1]["failure"]
    engine.add_request("after", [1, 2, 3], SamplingParams(max_tokens=4, temperature=0))
    assert _replica_stats(engine, "outstanding_requests") == [1, 0]
    assert _finish_all(engine)["after"].outputs[0].finish_reason in ("length", "stop")
    engine.replicas[0].failure = "replica 0 lost"
    with pytest.raises(ReplicaError, match="every data-parallel replica has failed"):
        engine.add_request("none", [1, 2, 3], LONG)


@pytest.mark.slow
def test_replica_processes_abort_and_survive_a_killed_replica():
    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, **OPTIONS)
    try:
        reference = _run(LLMEngine("ouro-tiny", **OPTIONS), SHORT_PROMPTS, [LONG] * 4)
        for i, prompt in enumerate(SHORT_PROMPTS):
            engine.add_request(f"q{i}", prompt, LONG)
        assert _replica_stats(engine, "outstanding_requests") == [2, 2]
        out = engine.abort_request("q3")  # across the pipe to replica 1
        assert out.finished and out.outputs[0].finish_reason == "abort" and len(out.outputs[0].token_ids) < 40
        streamed = {}
        while "q1" not in streamed:  # replica 1 is mid-request when it dies
            streamed.update({o.request_id: o for o in engine.step() if o.outputs[0].token_ids})
        os.kill(engine.replicas[1].pid, signal.SIGKILL)
        done = _finish_all(engine)
        failed = done["q1"]
        assert failed.outputs[0].finish_reason == "error" and len(failed.outputs[0].token_ids) < 40
        assert "replica 1" in failed.error and "killed by signal 9" in failed.error
        for rid in ("q0", "q2"):  # replica 0's requests are untouched: bit for bit those of one engine
            assert _signature(done[rid]) == _signature(reference[rid])
        stats = engine.stats()
        assert stats["data_parallel"]["alive"] == 1 and not stats["data_parallel"]["replicas"][1]["alive"]
        engine.add_request("after", SHORT_PROMPTS[1], LONG)
        assert _signature(_finish_all(engine)["after"]) == _signature(reference["q1"])
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_a_replica_that_cannot_load_raises_its_own_error():
    with pytest.raises(ConfigError, match=r"replica \d \(cpu\) failed to load: num_loops must be in 1\.\.8"):
        DataParallelEngine("ouro-tiny", data_parallel_size=2, num_loops=9, **OPTIONS)
