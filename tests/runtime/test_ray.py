"""The Ray backend: data-parallel replicas as Ray actors, and the Ray Data batch path.

The reference for every output is one LLMEngine given the same requests in the same order (as in
test_data_parallel.py). Tests that start a Ray cluster skip when Ray is not installed (it is the
optional extra `rlt[ray]`) and are `slow`: a local cluster and its actors take 20-30 s to start
on two cores. Option and placement checks run without Ray.
"""

from __future__ import annotations

import json
import sys
import time
import types

import pytest

from rlt_runtime import ConfigError, EngineConfig, LLM
from rlt_runtime.engine.data_parallel import DataParallelEngine
from rlt_runtime.engine.llm_engine import LLMEngine
from rlt_runtime.engine.ray_replica import placement
from test_data_parallel import (LONG, OPTIONS, SHORT_PROMPTS, _finish_all, _reference, _replica_stats, _run, _signature,
                                _workload)


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


def _cluster(**resources):
    return types.SimpleNamespace(cluster_resources=lambda: resources)


def test_placement_asks_ray_for_one_gpu_per_replica_or_a_share_of_the_cpus():
    assert placement("auto", 2, _cluster(CPU=16.0, GPU=2.0)) == ("cuda", {"num_gpus": 1}, 0)
    assert placement("cuda", 3, _cluster(CPU=8.0, GPU=4.0)) == ("cuda", {"num_gpus": 1}, 0)
    assert placement("auto", 2, _cluster(CPU=5.0)) == ("cpu", {"num_cpus": 2}, 2)  # no GPU in the cluster
    assert placement("cpu", 2, _cluster(CPU=8.0, GPU=2.0)) == ("cpu", {"num_cpus": 4}, 4)
    with pytest.raises(ConfigError, match=r"at most the number of GPUs in the Ray cluster \(2\).*got 3"):
        placement("auto", 3, _cluster(CPU=16.0, GPU=2.0))
    with pytest.raises(ConfigError, match=r"has 1 CPUs, fewer than the 2 CPU replicas"):
        placement("cpu", 2, _cluster(CPU=1.0))
    with pytest.raises(ConfigError, match=r"device='cuda:1' names one GPU.*Ray assigns"):
        placement("cuda:1", 1, _cluster(CPU=8.0, GPU=2.0))


# ---- on a local Ray cluster ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False)
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
def test_a_ray_replica_that_cannot_load_raises_its_own_error_and_frees_the_others(ray_cluster):
    with pytest.raises(ConfigError, match=r"replica \d \(cpu\) failed to load: num_loops must be in 1\.\.8"):
        DataParallelEngine("ouro-tiny", data_parallel_size=2, distributed_executor="ray", num_loops=9, **OPTIONS)
    deadline = time.monotonic() + 30
    while ray_cluster.available_resources().get("CPU", 0) < 2:  # both actors are killed, their CPUs back
        assert time.monotonic() < deadline, f"replica actors left running: {ray_cluster.available_resources()}"
        time.sleep(0.5)


@pytest.mark.slow
def test_ray_data_batch_writes_one_engines_outputs_in_input_order(ray_cluster, tmp_path):
    """rlt-batch over a JSON lines file, two engine actors, batches of 3: every line is, in input
    order, what one engine gives the whole list, down to unseeded samples (a result out of place,
    or a prompt run without its input position as arrival index, breaks this)."""
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
