"""Data parallelism over tensor-parallel engines: data_parallel_size=2 x tensor_parallel_size=2 on
CPU runs two replicas, each an engine whose model is split over two gloo ranks of its own.

The reference for every output is one engine with tensor_parallel_size=2 given the same requests
(batch invariance, arrival-keyed randomness and the ranks' rank-order sums make each request's
bits independent of the replica that runs it), and, for greedy requests, the dense reference.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time
import types

import pytest
import torch
from test_data_parallel import LONG, OPTIONS, SHORT_PROMPTS, _finish_all, _replica_stats, _run, _signature, _workload
from test_engine_reference import reference

from rlt_runtime import ConfigError, EngineConfig, LLM
from rlt_runtime.engine.data_parallel import DataParallelEngine, replica_devices
from rlt_runtime.engine.llm_engine import LLMEngine
from rlt_runtime.engine.ray_replica import placement
from rlt_runtime.executor.multiproc import MultiprocExecutor, rank_device
from rlt_runtime.executor.worker import WorkerSpec
from rlt_runtime.models.presets import preset_config

TP = dict(OPTIONS, tensor_parallel_size=2)


@functools.lru_cache(maxsize=None)
def _tp_reference(model: str) -> tuple[dict, dict]:
    """Signatures of the data-parallel workload, then of SHORT_PROMPTS under LONG, each run by one
    tensor_parallel_size=2 engine."""
    engine = LLMEngine(model, **TP)
    try:
        runs = (_workload(), (SHORT_PROMPTS, [LONG] * len(SHORT_PROMPTS)))
        return tuple({rid: _signature(out) for rid, out in _run(engine, *run).items()} for run in runs)
    finally:
        engine.shutdown()


# ---- devices and options -----------------------------------------------------------------------------

def test_tensor_parallelism_combines_with_ray_and_disaggregated_prefill():
    """Ray places tensor-parallel replicas (test_ray.py); only the cluster's size can refuse them,
    with an error naming both sizes and what the cluster has. Disaggregated prefill takes
    tensor-parallel engines (test_disaggregated_prefill.py)."""
    EngineConfig(tensor_parallel_size=2, data_parallel_size=2, distributed_executor="ray").validate_static()
    cluster = types.SimpleNamespace(cluster_resources=lambda: {"CPU": 3.0},
                                    nodes=lambda: [{"Alive": True, "Resources": {"CPU": 3.0}}])
    with pytest.raises(ConfigError, match=r"data_parallel_size \(2\) x tensor_parallel_size \(2\) needs 2 CPU "
                                          r"replicas of 2 CPUs each.*the Ray cluster has 3 CPUs"):
        placement("cpu", 2, 2, cluster)
    EngineConfig(tensor_parallel_size=2, disaggregated_prefill=True).validate_static()


# ---- outputs, stats and a failed rank ------------------------------------------------------------------
@pytest.mark.slow
def test_in_process_replicas_of_tensor_parallel_huginn_engines_match_one():
    """Two tensor-parallel engines in this process: four gloo ranks in two groups of their own."""
    engine = DataParallelEngine("huginn-tiny", data_parallel_size=2, backend="inprocess", **TP)
    try:
        prompts, params = _workload()
        done = _run(engine, prompts, params)
        assert {rid: _signature(out) for rid, out in done.items()} == _tp_reference("huginn-tiny")[0]
        assert all(r["stats"]["steps"] > 0 and len(r["workers"]) == 2 for r in engine.stats()["data_parallel"]["replicas"])
    finally:
        engine.shutdown()


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _kill_rank_mid_request(engine, pid: int) -> None:
    """Send the long requests k0..k3 (two per replica), step until replica 1's k1 has streamed a
    token, then SIGKILL the rank process `pid` (of replica 1)."""
    for i, prompt in enumerate(SHORT_PROMPTS):
        engine.add_request(f"k{i}", prompt, LONG)
    assert _replica_stats(engine, "outstanding_requests") == [2, 2]
    streamed = {}
    while "k1" not in streamed:  # replica 1 is mid-request when its rank dies
        streamed.update({o.request_id: o for o in engine.step() if o.outputs[0].token_ids})
    os.kill(pid, signal.SIGKILL)


def test_each_replica_takes_its_own_tensor_parallel_size_gpus(monkeypatch):
    """Replica r on cuda:(r*T), its ranks on cuda:(r*T)..cuda:(r*T+T-1): no two ranks share a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    cfg = EngineConfig(device="auto", data_parallel_size=2, tensor_parallel_size=2)
    cfg.validate_static()
    assert replica_devices(cfg) == ["cuda:0", "cuda:2"]
    assert [rank_device(d, r) for d in replica_devices(cfg) for r in (0, 1)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert replica_devices(EngineConfig(device="cuda", data_parallel_size=4)) == [f"cuda:{i}" for i in range(4)]
    assert rank_device("cuda", 1) == "cuda:1" and rank_device("cpu", 1) == "cpu"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    with pytest.raises(ConfigError, match=r"data_parallel_size \(2\) x tensor_parallel_size \(2\) must be at most "
                                          r"the number of CUDA devices \(3\)"):
        replica_devices(cfg)
    fields = {f.name: None for f in dataclasses.fields(WorkerSpec)}
    spec = WorkerSpec(**{**fields, "model_config": preset_config("ouro-tiny"), "device": "cuda:2"})
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2 on cuda:2 needs cuda:2..cuda:3 but 3 GPUs"):
        MultiprocExecutor(spec, 2)


@pytest.mark.slow
def test_replicas_of_tensor_parallel_engines_match_one_and_survive_a_killed_rank():
    llm = LLM("ouro-tiny", data_parallel_size=2, **TP)
    engine = llm.engine
    try:
        prompts, params = _workload()
        outs = llm.generate(prompts, params, use_tqdm=False)
        got = {f"q{i}": _signature(out) for i, out in enumerate(outs)}
        workload_reference, long_reference = _tp_reference("ouro-tiny")
        assert got == workload_reference
        for i in (4, 6):  # the greedy full-depth and max_loops=2 requests: the dense reference's tokens
            ref = reference("ouro-tiny", prompts[i], params[i].max_tokens, max_loops=params[i].max_loops)
            assert (outs[i].outputs[0].token_ids, outs[i].outputs[0].exit_depths) == (ref.tokens, ref.exit_depths)

        stats = engine.stats()
        per = stats["data_parallel"]["replicas"]
        assert stats["data_parallel"]["alive"] == 2 and all(r["stats"]["steps"] > 0 for r in per)
        for key in ("steps", "kv_blocks"):
            assert stats[key] == sum(r["stats"][key] for r in per)
        assert [[w["rank"] for w in r["workers"]] for r in per] == [[0, 1], [0, 1]]
        pids = [w["pid"] for r in per for w in r["workers"]]
        assert len(set(pids)) == 4 and all(_running(pid) for pid in pids)

        _kill_rank_mid_request(engine, per[1]["workers"][1]["pid"])
        done = _finish_all(engine)
        for rid in ("k1", "k3"):
            out = done[rid]
            assert out.outputs[0].finish_reason == "error" and len(out.outputs[0].token_ids) < 40
            assert "replica 1" in out.error and "tensor-parallel rank" in out.error, out.error
        for i in (0, 2):  # replica 0 goes on, bit for bit
            assert done[f"k{i}"].error is None and _signature(done[f"k{i}"]) == long_reference[f"q{i}"]
        stats = engine.stats()["data_parallel"]
        assert stats["alive"] == 1 and not stats["replicas"][1]["alive"]
        deadline = time.monotonic() + 20
        while any(_running(w["pid"]) for w in per[1]["workers"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_running(w["pid"]) for w in per[1]["workers"]), "the failed replica's ranks must stop"
        assert all(_running(w["pid"]) for w in per[0]["workers"])
        engine.add_request("after", SHORT_PROMPTS[1], LONG)
        assert _replica_stats(engine, "outstanding_requests") == [1, 0]
        assert _signature(_finish_all(engine)["after"]) == long_reference["q1"]
    finally:
        engine.shutdown()
