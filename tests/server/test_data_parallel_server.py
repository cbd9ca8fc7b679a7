"""rlt-serve over data-parallel replicas: answers through the openai client, aggregated /metrics,
a failed replica's requests get the engine-failure 500 while the other replica serves."""

from __future__ import annotations

import re

import httpx
import pytest

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.engine.data_parallel import DataParallelEngine

openai = pytest.importorskip("openai")

MODEL = "ouro-tiny"
ENGINE_DEFAULTS = dict(dtype="float32", device="cpu", max_num_seqs=16, num_blocks=512, max_model_len=128)
PROMPTS = ["The quick brown fox", "Hello there", "A looped model runs", "Numbers: 1 2 3"]
SHARED = "Once upon a time there was a looped model that read every prompt three times over and"


def _metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(url + "/metrics").text
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    assert m, f"{name}{labels} not exported"
    return float(m.group(1))


@pytest.mark.slow
def test_rlt_serve_with_two_replica_processes(start_process, tmp_path):
    proc, url = start_process(tmp_path / "serve.log", "--data-parallel-size", "2", "--max-num-seqs", "4")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        reference = LLM(MODEL, dtype="float32", device="cpu", num_blocks=256, max_num_seqs=4)
        greedy = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0,
                                           extra_body={"ignore_eos": True})
        expected = reference.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                                      use_tqdm=False)
        assert [c.text for c in sorted(greedy.choices, key=lambda c: c.index)] == [o.outputs[0].text for o in expected]
        chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                              temperature=1.0, seed=7)
        assert chat.choices[0].message.content is not None and chat.usage.completion_tokens >= 1

        # Two requests sharing their first blocks while the first still runs: least work alone would
        # send the second to the idle replica; prefix affinity keeps it on the first one's, whose
        # prefix cache then serves the shared blocks.
        stream = client.completions.create(model=MODEL, prompt=SHARED + " one", max_tokens=40, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        client.completions.create(model=MODEL, prompt=SHARED + " two", max_tokens=2, temperature=0)
        for _ in stream:
            pass
        assert _metric(url, "vllm:prefix_cache_hits_total") >= 1

        assert _metric(url, "rlt:replica_up", '{replica="0"}') == 1.0
        assert _metric(url, "rlt:replica_up", '{replica="1"}') == 1.0
        assert _metric(url, "vllm:num_requests_running") == 0
        assert _metric(url, "vllm:request_success_total", '{finished_reason="length"}') == len(PROMPTS) + 3
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()


@pytest.mark.slow
def test_rlt_serve_with_two_tensor_parallel_replicas(start_process, tmp_path):
    """--data-parallel-size 2 --tensor-parallel-size 2: two replica processes with two ranks each
    answer as one tensor-parallel engine does, and the server stops all six processes cleanly."""
    proc, url = start_process(tmp_path / "serve.log", "--data-parallel-size", "2", "--tensor-parallel-size", "2",
                              "--max-num-seqs", "4")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        greedy = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0,
                                           extra_body={"ignore_eos": True})
        reference = LLM(MODEL, dtype="float32", device="cpu", num_blocks=256, max_num_seqs=4, tensor_parallel_size=2)
        try:
            expected = reference.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                                          use_tqdm=False)
        finally:
            reference.engine.shutdown()
        assert [c.text for c in sorted(greedy.choices, key=lambda c: c.index)] == [o.outputs[0].text for o in expected]
        assert _metric(url, "rlt:replica_up", '{replica="0"}') == 1.0
        assert _metric(url, "rlt:replica_up", '{replica="1"}') == 1.0
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()


@pytest.mark.slow
def test_rlt_serve_with_a_tensor_parallel_ray_replica(start_process, tmp_path, monkeypatch):
    """--distributed-executor ray --tensor-parallel-size 2 on a new local Ray cluster (this host's
    CPUs): one actor whose two ranks are its child processes answers as one tensor-parallel engine
    does; the server stops cleanly."""
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", "local")  # a cluster of its own, whatever `ray start` left on this host
    proc, url = start_process(tmp_path / "serve.log", "--distributed-executor", "ray", "--tensor-parallel-size", "2",
                              "--max-num-seqs", "4")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        greedy = client.completions.create(model=MODEL, prompt=PROMPTS[:2], max_tokens=5, temperature=0,
                                           extra_body={"ignore_eos": True})
        seeded = client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=5, temperature=1.0, seed=7,
                                           extra_body={"ignore_eos": True})
        reference = LLM(MODEL, dtype="float32", device="cpu", num_blocks=256, max_num_seqs=4, tensor_parallel_size=2)
        try:
            expected = reference.generate(PROMPTS[:3], [SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)] * 2
                                          + [SamplingParams(max_tokens=5, temperature=1.0, seed=7, ignore_eos=True)],
                                          use_tqdm=False)
        finally:
            reference.engine.shutdown()
        got = [c.text for c in sorted(greedy.choices, key=lambda c: c.index)] + [seeded.choices[0].text]
        assert got == [o.outputs[0].text for o in expected]
        assert _metric(url, "rlt:replica_up", '{replica="0"}') == 1.0
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()


def test_a_failed_replica_answers_500_and_the_other_keeps_serving(start_server):
    factory = lambda: DataParallelEngine(MODEL, data_parallel_size=2, backend="inprocess", **ENGINE_DEFAULTS)  # noqa: E731
    with start_server(engine_factory=factory) as server:
        assert server.worker.wait_ready(120)

        def break_replica_1(engine):
            broken = engine.replicas[1].engine

            def failing_step(final_only=False):
                raise RuntimeError("device lost")

            broken.step = failing_step
            engine.router.add(0, 10**6)  # replica 0 looks busy: the next request goes to replica 1

        server.on_engine(break_replica_1)
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
        failed = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert failed.status_code == 500
        assert "replica 1" in failed.json()["error"]["message"] and "device lost" in failed.json()["error"]["message"]
        server.on_engine(lambda engine: engine.router.add(0, -10**6))
        ok = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
        assert _metric(server.url, "rlt:replica_up", '{replica="0"}') == 1.0
        assert _metric(server.url, "rlt:replica_up", '{replica="1"}') == 0.0
        assert _metric(server.url, "vllm:request_success_total", '{finished_reason="error"}') == 1.0
        assert httpx.get(server.url + "/health").status_code == 200
