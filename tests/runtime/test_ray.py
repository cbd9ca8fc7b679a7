"""The Ray backend: data-parallel replicas as Ray actors, and the Ray Data batch path.

The reference for every output is one LLMEngine given the same requests in the same order (as in
test_data_parallel.py) — for tensor-parallel replicas, one engine with the same
tensor_parallel_size (as in test_data_tensor_parallel.py). Tests that start a Ray cluster skip
when Ray is not installed (it is the optional extra `rlt[ray]`) and are `slow`: a local cluster
and its actors take 20-30 s to start on two cores. Option and placement checks run without Ray.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import types

import pytest
import torch

from rlt_runtime import ConfigError, EngineConfig, LLM, SamplingParams
from rlt_runtime.engine.data_parallel import DataParallelEngine
from rlt_runtime.engine.llm_engine import LLMEngine
from rlt_runtime.engine.ray_replica import actor_gpus, placement
from test_data_parallel import (LONG, OPTIONS, SHORT_PROMPTS, _finish_all, _reference, _replica_stats, _run, _signature,
                                _workload)
from test_data_tensor_parallel import _kill_rank_mid_request, _running, _tp_reference


# ---- options and placement (no Ray needed) ---------------------------------------------------------
def test_distributed_executor_is_mp_or_ray():
    assert EngineConfig().distributed_executor == "mp"
    with pytest.raises(ConfigError, match=r"distributed_executor.*'mp', 'ray'"):
        EngineConfig(distributed_executor="dask").validate_static()


def test_the_ray_executor_without_ray_installed_is_a_config_error(monkeypatch, capsys):
    from rlt_runtime.entrypoints.ray_batch import generate_batch
    from rlt_runtime.entrypoints.server import cli as serve_cli

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ConfigError, match=r"distributed_executor='ray' needs Ray.*pip install 'rlt\[ray\]'"):
        LLM("ouro-tiny", distributed_executor="ray", **OPTIONS)
    with pytest.raises(ConfigError, match="needs Ray"):
        generate_batch("ouro-tiny", [[1, 2, 3]], **OPTIONS)
    assert serve_cli.main(["--model", "ouro-tiny", "--distributed-executor", "ray"]) == 2  # before the port opens
    assert "needs Ray" in capsys.readouterr().err


def _cluster(*nodes):
    """A connected Ray cluster as `placement` sees it: one resources dict per node."""
    total = {key: sum(n.get(key, 0) for n in nodes) for key in ("CPU", "GPU")}
    return types.SimpleNamespace(cluster_resources=lambda: {k: v for k, v in total.items() if v},
                                 nodes=lambda: [{"Alive": True, "Resources": n} for n in nodes]
                                 + [{"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}])


def test_placement_asks_ray_for_one_gpu_per_replica_or_a_share_of_the_cpus():
    assert placement("auto", 2, 1, _cluster({"CPU": 16.0, "GPU": 2.0})) == ("cuda", {"num_gpus": 1}, 0)
    assert placement("cuda", 3, 1, _cluster({"CPU": 8.0, "GPU": 4.0})) == ("cuda", {"num_gpus": 1}, 0)
    assert placement("auto", 2, 1, _cluster({"CPU": 5.0})) == ("cpu", {"num_cpus": 2}, 2)  # no GPU in the cluster
    assert placement("cpu", 2, 1, _cluster({"CPU": 8.0, "GPU": 2.0})) == ("cpu", {"num_cpus": 4}, 4)
    with pytest.raises(ConfigError, match=r"data_parallel_size \(3\) x tensor_parallel_size \(1\) needs 3 replicas "
                                          r"of 1 GPUs each.*the Ray cluster has 2 GPUs"):
        placement("auto", 3, 1, _cluster({"CPU": 16.0, "GPU": 2.0}))
    with pytest.raises(ConfigError, match=r"needs 2 CPU replicas of 1 CPUs each.*Ray cluster has 1 CPUs"):
        placement("cpu", 2, 1, _cluster({"CPU": 1.0}))
    with pytest.raises(ConfigError, match=r"device='cuda:1' names one GPU.*Ray assigns"):
        placement("cuda:1", 1, 1, _cluster({"CPU": 8.0, "GPU": 2.0}))


def test_placement_gives_each_tensor_parallel_replica_its_ranks_gpus_on_one_node():
    """A replica actor of tensor_parallel_size T asks for T GPUs (so Ray keeps its group on one
    node), or at least T CPUs; the check counts what one node can hold, not the cluster's sum."""
    assert placement("auto", 2, 2, _cluster({"CPU": 16.0, "GPU": 4.0})) == ("cuda", {"num_gpus": 2}, 0)
    assert placement("cuda", 1, 4, _cluster({"GPU": 4.0}, {"GPU": 1.0})) == ("cuda", {"num_gpus": 4}, 0)
    assert placement("cpu", 2, 2, _cluster({"CPU": 4.0})) == ("cpu", {"num_cpus": 2}, 2)
    assert placement("cpu", 1, 2, _cluster({"CPU": 4.0})) == ("cpu", {"num_cpus": 4}, 4)
    # 8 CPUs in all, but shares of 4 fit on neither node: the largest share every replica gets is 3
    assert placement("cpu", 2, 2, _cluster({"CPU": 3.0}, {"CPU": 3.0}, {"CPU": 2.0})) == ("cpu", {"num_cpus": 3}, 3)
    with pytest.raises(ConfigError, match=r"data_parallel_size \(2\) x tensor_parallel_size \(2\) needs 2 replicas "
                                          r"of 2 GPUs each, each on one node \(4 GPUs in all\); the Ray cluster has 3 GPUs"):
        placement("auto", 2, 2, _cluster({"CPU": 16.0, "GPU": 3.0}))
    with pytest.raises(ConfigError, match=r"the Ray cluster has 4 GPUs \(per node: \[1, 1, 2\]\)"):
        placement("auto", 2, 2, _cluster({"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 2.0}))  # one node holds a group
    with pytest.raises(ConfigError, match=r"data_parallel_size \(2\) x tensor_parallel_size \(2\) needs 2 CPU "
                                          r"replicas of 2 CPUs each, each on one node; the Ray cluster has 3 CPUs"):
        placement("cpu", 2, 2, _cluster({"CPU": 3.0}))
    with pytest.raises(ConfigError, match=r"has 4 CPUs \(per node: \[1, 1, 1, 1\]\)"):
        placement("cpu", 1, 2, _cluster({"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}))


def test_an_actor_shows_its_engine_and_ranks_exactly_the_gpus_ray_assigned_it():
    assert actor_gpus(["6", "7"], 2) == "6,7"  # seen inside the actor (and by its ranks) as cuda:0 and cuda:1
    assert actor_gpus([3], 1) == "3"
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2 needs 2 GPUs in its Ray actor, but Ray assigned "
                                          r"it 1 \(\['0'\]\)"):
        actor_gpus([0], 2)


class _FakeRay:
    """Just enough of `ray` for start_ray_replicas: records each actor's options and load call;
    every load fails (so no reader thread starts)."""

    exceptions = types.SimpleNamespace(RayError=RuntimeError, RayActorError=RuntimeError)

    def __init__(self, *nodes):
        self._cluster = _cluster(*nodes)
        self.actor_options, self.loads, self.killed = [], [], 0

    def is_initialized(self):
        return True

    def cluster_resources(self):
        return self._cluster.cluster_resources()

    def nodes(self):
        return self._cluster.nodes()

    def remote(self, cls):
        fake = self

        def options(**kwargs):
            fake.actor_options.append(kwargs)
            load = types.SimpleNamespace(remote=lambda *args: fake.loads.append(args) or ("load", args))
            stop = types.SimpleNamespace(remote=lambda: ("stop",))
            return types.SimpleNamespace(remote=lambda: types.SimpleNamespace(load=load, stop=stop))

        return types.SimpleNamespace(options=options)

    def wait(self, refs, timeout):
        return refs, []

    def get(self, ref, timeout=None):
        return ("failed", "ConfigError", "not loaded here") if ref[0] == "load" else None

    def kill(self, actor, no_restart):
        self.killed += 1


@pytest.mark.parametrize("device, nodes, resources, engine_device", [
    ("auto", ({"CPU": 8.0, "GPU": 4.0},), {"num_gpus": 2}, "cuda"),
    ("cpu", ({"CPU": 6.0},), {"num_cpus": 3}, "cpu"),
])
def test_each_replica_actor_is_started_with_its_tensor_parallel_resources(monkeypatch, device, nodes, resources,
                                                                          engine_device):
    """Through start_ray_replicas (a fake `ray`): both actors of DP=2 x TP=2 ask Ray for T GPUs
    (or their CPU share) and load their engine, with tensor_parallel_size, on the actor's device."""
    from rlt_runtime.engine.data_parallel import _replica_options
    from rlt_runtime.engine.ray_replica import ACTOR_THREADS, start_ray_replicas

    fake = _FakeRay(*nodes)
    monkeypatch.setitem(sys.modules, "ray", fake)
    cfg = EngineConfig.from_kwargs(**dict(OPTIONS, device=device), data_parallel_size=2, tensor_parallel_size=2,
                                   distributed_executor="ray")
    with pytest.raises(ConfigError, match=r"replica 0 \(\w+\) failed to load: not loaded here"):
        start_ray_replicas("ouro-tiny", [_replica_options(cfg, i) for i in range(2)], device)
    assert fake.actor_options == [dict(resources, max_concurrency=ACTOR_THREADS)] * 2
    assert [(model, options["tensor_parallel_size"], options["distributed_executor"], dev) for model, options, dev, _
            in fake.loads] == [("ouro-tiny", 2, "mp", engine_device)] * 2
    assert fake.killed == 2  # the first load error stops both actors


# ---- on a local Ray cluster ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:  # 4 logical CPUs (on any number of cores): two replicas of two tensor-parallel ranks each
        ray.init(num_cpus=4, include_dashboard=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.mark.slow
def test_ray_replicas_match_one_engine_bit_for_bit(ray_cluster):
    llm = LLM("ouro-tiny", data_parallel_size=2, distributed_executor="ray", **OPTIONS)
    try:
        prompts, params = _workload()
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert {f"q{i}": _signature(out) for i, out in enumerate(outs)} == _reference("ouro-tiny")
        stats = llm.stats()
        replicas = stats["data_parallel"]["replicas"]
        assert stats["data_parallel"]["alive"] == 2 and all(r["alive"] and r["actor_id"] for r in replicas)
        assert all(r["stats"]["steps"] > 0 for r in replicas), "both replica actors must have run requests"
        assert stats["steps"] == sum(r["stats"]["steps"] for r in replicas)
        assert stats["prefix_cache_hits"] > 0  # the shared first block went to one replica
    finally:
        llm.engine.shutdown()


@pytest.mark.slow
def test_ray_replicas_take_new_weights(ray_cluster):
    """update_weights reaches every replica actor, asleep as beside a trainer (sleep level 2, the
    weights woken and written in two parts, then the KV cache): greedy tokens of the engine built
    with the weights."""
    from rlt_runtime.models.presets import preset_config, preset_weights

    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, distributed_executor="ray", enable_sleep_mode=True,
                                **OPTIONS)
    try:
        weights = dict(preset_weights(preset_config("ouro-tiny"), seed=1, dtype=torch.float32))
        assert engine.sleep(level=2) > 0 and engine.is_sleeping()
        engine.wake_up(tags=["weights"])
        engine.update_weights(list(weights.items())[::2])
        engine.update_weights(list(weights.items())[1::2])
        engine.wake_up(tags=["kv_cache"])
        assert not engine.is_sleeping()
        params = SamplingParams(max_tokens=6, temperature=0, seed=2, ignore_eos=True)
        prompts = [[5, 6, 7, 8], list(range(20, 40))]
        for i, prompt in enumerate(prompts):
            engine.add_request(f"w{i}", prompt, params)
        got = {rid: out.outputs[0].token_ids for rid, out in _finish_within(engine, 120).items()}
        want = LLM("ouro-tiny", seed=0, **OPTIONS)
        want.update_weights(weights.items())
        assert got == {f"w{i}": o.outputs[0].token_ids for i, o in enumerate(want.generate(prompts, params,
                                                                                            use_tqdm=False))}
        assert engine.reset_prefix_cache() >= 1 and engine.reset_prefix_cache() == 0  # the 20-token prompt's block
    finally:
        engine.shutdown()


def _finish_within(engine, seconds: float) -> dict:
    """_finish_all, failing instead of hanging when a dead replica's requests never end."""
    done, deadline = {}, time.monotonic() + seconds
    while engine.has_unfinished_requests():
        assert time.monotonic() < deadline, f"requests unfinished after {seconds} s: a dead replica went unnoticed"
        done.update({out.request_id: out for out in engine.step() if out.finished})
    return done


@pytest.mark.slow
def test_a_killed_ray_replica_fails_only_its_requests(ray_cluster):
    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, distributed_executor="ray", **OPTIONS)
    try:
        reference = _run(LLMEngine("ouro-tiny", **OPTIONS), SHORT_PROMPTS, [LONG] * 4)
        for i, prompt in enumerate(SHORT_PROMPTS):
            engine.add_request(f"q{i}", prompt, LONG)
        assert _replica_stats(engine, "outstanding_requests") == [2, 2]
        out = engine.abort_request("q3")  # through Ray to replica 1
        assert out.finished and out.outputs[0].finish_reason == "abort" and len(out.outputs[0].token_ids) < 40
        streamed = {}
        while "q1" not in streamed:  # replica 1 is mid-request when it dies
            streamed.update({o.request_id: o for o in engine.step() if o.outputs[0].token_ids})
        ray_cluster.kill(engine.replicas[1].actor)
        done = _finish_within(engine, 120)
        failed = done["q1"]
        assert failed.outputs[0].finish_reason == "error" and len(failed.outputs[0].token_ids) < 40
        assert "replica 1" in failed.error and "died" in failed.error
        assert engine.replicas[1].info["actor_id"] in failed.error
        for rid in ("q0", "q2"):  # replica 0's requests are untouched: bit for bit those of one engine
            assert _signature(done[rid]) == _signature(reference[rid])
        stats = engine.stats()["data_parallel"]
        assert stats["alive"] == 1 and [r["alive"] for r in stats["replicas"]] == [True, False]
        engine.add_request("after", SHORT_PROMPTS[1], LONG)
        assert _replica_stats(engine, "outstanding_requests") == [1, 0]
        assert _signature(_finish_all(engine)["after"]) == _signature(reference["q1"])
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_a_stopped_ray_replica_is_failed_as_hung(ray_cluster):
    """Replica 1's actor process stops (SIGSTOP) mid-request: after step_timeout_s without an answer
    its requests end with an error naming it as hung, its actor is killed (its CPUs go back), and
    replica 0's requests keep one engine's bits."""
    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, distributed_executor="ray", step_timeout_s=4,
                                **OPTIONS)
    try:
        reference = _run(LLMEngine("ouro-tiny", **OPTIONS), SHORT_PROMPTS, [LONG] * 4)
        for i, prompt in enumerate(SHORT_PROMPTS):
            engine.add_request(f"q{i}", prompt, LONG)
        streamed = {}
        while "q1" not in streamed:  # replica 1 is mid-request when it stops
            streamed.update({o.request_id: o for o in engine.step() if o.outputs[0].token_ids})
        os.kill(engine.replicas[1].info["pid"], signal.SIGSTOP)
        done = _finish_within(engine, 120)
        for rid in ("q1", "q3"):
            failed = done[rid]
            assert failed.outputs[0].finish_reason == "error" and "replica 1" in failed.error
            assert "answered nothing for 4 s (step_timeout_s): hung, stopped" in failed.error
        for rid in ("q0", "q2"):
            assert _signature(done[rid]) == _signature(reference[rid])
    finally:
        engine.shutdown()
    _wait_for_cpus_back(ray_cluster)


@pytest.mark.slow
def test_a_ray_replica_that_cannot_load_raises_its_own_error_and_frees_the_others(ray_cluster):
    with pytest.raises(ConfigError, match=r"replica \d \(cpu\) failed to load: num_loops must be in 1\.\.8"):
        DataParallelEngine("ouro-tiny", data_parallel_size=2, distributed_executor="ray", num_loops=9, **OPTIONS)
    _wait_for_cpus_back(ray_cluster)


def _wait_for_cpus_back(ray, seconds: float = 30):
    """Wait until every CPU of the cluster is free again: every replica actor is gone."""
    deadline = time.monotonic() + seconds
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]:
        assert time.monotonic() < deadline, f"replica actors left running: {ray.available_resources()}"
        time.sleep(0.5)


# ---- tensor-parallel replicas on Ray --------------------------------------------------------------
def _wait_until_stopped(pids: list, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not any(_running(pid) for pid in pids)


@pytest.mark.slow
def test_one_tensor_parallel_ray_replica_matches_one_tensor_parallel_engine(ray_cluster):
    """DP=1 x TP=2 on Ray: one actor holding all 4 CPUs, its two gloo ranks its child processes;
    outputs bit for bit those of one TP=2 engine (mp) on the data-parallel workload (greedy,
    seeded, unseeded, n=2, early exit, max_loops); shutdown stops the ranks and the actor."""
    llm = LLM("ouro-tiny", distributed_executor="ray", tensor_parallel_size=2, **OPTIONS)
    try:
        prompts, params = _workload()
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert {f"q{i}": _signature(out) for i, out in enumerate(outs)} == _tp_reference("ouro-tiny")[0]
        (replica,) = llm.stats()["data_parallel"]["replicas"]
        assert replica["alive"] and replica["actor_id"] and replica["stats"]["steps"] > 0
        assert [(w["rank"], w["device"]) for w in replica["workers"]] == [(0, "cpu"), (1, "cpu")]
        pids = [w["pid"] for w in replica["workers"]]
        assert all(_running(pid) for pid in pids)
        assert ray_cluster.available_resources().get("CPU", 0) == 0  # the actor holds its share: all 4
    finally:
        llm.engine.shutdown()
    assert _wait_until_stopped(pids), "shutdown must stop the actor's ranks"
    _wait_for_cpus_back(ray_cluster)


@pytest.mark.slow
def test_tensor_parallel_ray_replicas_match_one_engine_and_survive_a_killed_rank(ray_cluster):
    """DP=2 x TP=2 on Ray: two actors of two ranks each give one TP=2 engine's outputs; a rank
    of replica 1 killed mid-request fails only replica 1's requests, naming the rank, and its
    actor and other rank stop (its CPUs go back); replica 0 goes on bit for bit."""
    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, tensor_parallel_size=2,
                                distributed_executor="ray", **OPTIONS)
    try:
        workload_reference, long_reference = _tp_reference("ouro-tiny")
        prompts, params = _workload()
        assert {rid: _signature(out) for rid, out in _run(engine, prompts, params).items()} == workload_reference
        per = engine.stats()["data_parallel"]["replicas"]
        assert all(r["stats"]["steps"] > 0 for r in per), "both replica actors must have run requests"
        assert len({r["actor_id"] for r in per}) == 2 and [len(r["workers"]) for r in per] == [2, 2]
        pids = [[w["pid"] for w in r["workers"]] for r in per]
        assert len(set(pids[0] + pids[1])) == 4 and all(_running(pid) for pid in pids[0] + pids[1])

        _kill_rank_mid_request(engine, pids[1][1])
        done = _finish_within(engine, 120)
        for rid in ("k1", "k3"):
            out = done[rid]
            assert out.outputs[0].finish_reason == "error" and len(out.outputs[0].token_ids) < 40
            assert "replica 1" in out.error and "tensor-parallel rank" in out.error, out.error
            assert per[1]["actor_id"] in out.error
        for rid in ("k0", "k2"):  # replica 0 goes on, bit for bit
            assert done[rid].error is None and _signature(done[rid]) == long_reference[rid.replace("k", "q")]
        stats = engine.stats()["data_parallel"]
        assert stats["alive"] == 1 and [r["alive"] for r in stats["replicas"]] == [True, False]
        assert _wait_until_stopped(pids[1]), "the failed replica's ranks must stop"
        deadline = time.monotonic() + 30  # its actor is killed: its 2 CPUs go back to the cluster
        while ray_cluster.available_resources().get("CPU", 0) < 2:
            assert time.monotonic() < deadline, f"the failed replica's actor still holds {ray_cluster.available_resources()}"
            time.sleep(0.2)
        assert all(_running(pid) for pid in pids[0])
        engine.add_request("after", SHORT_PROMPTS[1], LONG)
        assert _replica_stats(engine, "outstanding_requests") == [1, 0]
        assert _signature(_finish_within(engine, 120)["after"]) == long_reference["q1"]
    finally:
        engine.shutdown()
    assert _wait_until_stopped(pids[0]), "shutdown must stop every actor's ranks"
    _wait_for_cpus_back(ray_cluster)


@pytest.mark.slow
def test_ray_data_batch_writes_one_engines_outputs_in_input_order(ray_cluster, tmp_path):
    """rlt-batch over a JSON lines file, two engine actors, batches of 3: every line is, in input
    order, what one engine gives the whole list, down to unseeded samples (a result out of place,
    or a prompt run without its input position as arrival index, breaks this)."""
    pytest.importorskip("ray.data", reason="Ray Data needs ray[data] (pandas, pyarrow)")
    from rlt_runtime.entrypoints.ray_batch import build_parser, main
    from rlt_runtime.entrypoints.cli import sampling_params

    prompts, _ = _workload()
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in prompts))
    argv = ["--model", "ouro-tiny", "--prompt-file", str(source), "--output", str(tmp_path / "out.jsonl"),
            "--concurrency", "2", "--batch-size", "3", "--max-tokens", "6", "--temperature", "0.8", "--ignore-eos",
            "--dtype", "float32", "--device", "cpu", "--max-num-seqs", "4", "--num-blocks", "256",
            "--max-model-len", "128"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    params = sampling_params(build_parser().parse_args(argv))
    assert params.temperature == 0.8 and params.seed is None
    expected = LLM("ouro-tiny", **OPTIONS).generate(prompts, params, use_tqdm=False)
    assert [r["index"] for r in rows] == list(range(len(prompts)))
    assert [(r["token_ids"], r["exit_depths"], r["finish_reason"], r["text"]) for r in rows] == [
        (o.outputs[0].token_ids, o.outputs[0].exit_depths, o.outputs[0].finish_reason, o.outputs[0].text)
        for o in expected]


def test_batch_results_are_written_by_index_as_soon_as_their_predecessors_are_in():
    """Actors finish batches out of order: results come out sorted by index, each once every
    smaller index is in (holding all back to the end, or writing in arrival order, fails this)."""
    from rlt_runtime.entrypoints.ray_batch import _in_index_order

    arrived = []

    def arrivals():
        for i in (3, 4, 0, 1, 2, 7, 5, 6, 11):
            arrived.append(i)
            yield {"index": i}

    out = [(r["index"], len(arrived)) for r in _in_index_order(arrivals())]
    # (index, records arrived when it was yielded): 0..4 once 2 (5th) is in, 5 at its arrival,
    # 6 and the held 7 at 6's, 11 (no 8..10) at the end
    assert out == [(0, 3), (1, 4), (2, 5), (3, 5), (4, 5), (5, 7), (6, 8), (7, 8), (11, 9)]
