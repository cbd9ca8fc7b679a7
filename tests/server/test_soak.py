"""Misbehaving clients under load: hundreds of concurrent streams with random disconnects, slow
requests past the timeout, too many requests, shutdown with requests in flight. Every request
ends (completed or aborted), the KV pool returns to full, nothing is logged as an error."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import random
import re
import threading
import time

import httpx
import pytest

from rlt_runtime.engine.llm_engine import LLMEngine

MODEL = "ouro-tiny"
SOAK_REQUESTS = 300


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _counter(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


async def _one(client: httpx.AsyncClient, i: int, rng: random.Random) -> str:
    body = {"model": MODEL, "prompt": f"soak request {i} " + "x" * rng.randint(0, 40), "stream": True,
            "max_tokens": rng.randint(2, 4), "temperature": 0.8, "seed": i, "ignore_eos": rng.random() < 0.5,
            "stream_options": {"include_usage": True}}
    mode = rng.choice(["complete", "complete", "disconnect_at_once", "disconnect_after_first"])
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        if mode == "disconnect_at_once":
            return "aborted"
        events = 0
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return "completed"
            assert '"error"' not in line, line
            events += 1
            if mode == "disconnect_after_first":
                return "aborted"
    raise AssertionError(f"request {i}: the stream ended without [DONE]")


async def _storm(url: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        return await asyncio.gather(*[_one(client, i, rng) for i in range(n)])


@pytest.fixture(scope="module")
def soak_server(start_server):
    with start_server(engine_options={"max_num_seqs": 64, "num_blocks": 1024}) as live:
        yield live


def test_soak_streams_with_random_disconnects(soak_server, caplog):
    url = soak_server.url
    caplog.set_level(logging.WARNING)
    asyncio.run(_storm(url, 100, seed=0))  # warm-up: allocator, code paths
    soak_server.wait_idle()
    gc.collect()
    rss_before = _rss_bytes()
    ended_before = _counter(url, "vllm:request_success_total")
    aborted_before = _counter(url, 'vllm:request_success_total{finished_reason="abort"}')

    start = time.monotonic()
    outcomes = asyncio.run(_storm(url, SOAK_REQUESTS, seed=1))
    soak_server.wait_idle(timeout=60)
    elapsed = time.monotonic() - start

    assert sorted(set(outcomes)) == ["aborted", "completed"] and len(outcomes) == SOAK_REQUESTS
    # Every request reached an end in the engine: finished (stop/length) or aborted on disconnect.
    assert _counter(url, "vllm:request_success_total") - ended_before == SOAK_REQUESTS
    assert _counter(url, 'vllm:request_success_total{finished_reason="abort"}') > aborted_before
    assert soak_server.kv_full()
    assert soak_server.worker.num_active == 0
    assert _counter(url, "vllm:num_requests_running") == 0 and _counter(url, "vllm:num_requests_waiting") == 0
    gc.collect()
    growth = _rss_bytes() - rss_before
    assert growth < 64 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over {SOAK_REQUESTS} requests"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert httpx.get(url + "/health").status_code == 200
    assert elapsed < 120


FAN_OUT_REQUESTS = 48
STOP_STRINGS = ["a", "e", " ", "the", "xx", "\n", "k"]
# How long one request may be refused (429) before the test calls the slots lost. A deadline, not a
# count of 429s: a request of 6 sequences waits until 6 slots are free at once, which smaller requests
# keep taking first, so on a slow or loaded machine it can wait most of the storm; and how many 429s
# fit into a wait depends on how fast the server answers them. A leaked slot never frees, so this
# still catches one.
SLOT_WAIT_S = 60.0


async def _fan_out_one(client: httpx.AsyncClient, i: int, rng: random.Random, gate: asyncio.Semaphore) -> int:
    """A prompt list x n with stop strings, streamed or not; retried after 429 until slots free up
    (for at most SLOT_WAIT_S). Returns the number of 429s it got."""
    prompts = [f"fan-out {i}.{j} " + "y" * rng.randint(0, 20) for j in range(rng.randint(1, 3))]
    n = rng.randint(1, 2)
    stop = rng.sample(STOP_STRINGS, rng.randint(1, 3))
    streaming = rng.random() < 0.6
    disconnect = streaming and rng.random() < 0.3
    body = {"model": MODEL, "prompt": prompts, "n": n, "stop": stop, "max_tokens": rng.randint(2, 4),
            "temperature": 0.8, "seed": i, "stream": streaming}
    texts: dict[int, str] = {}
    refused = 0
    async with gate:
        deadline = time.monotonic() + SLOT_WAIT_S
        while True:
            async with client.stream("POST", "/v1/completions", json=body) as resp:
                if resp.status_code == 429:
                    refused += 1
                    assert time.monotonic() < deadline, \
                        f"request {i}: no sequence slot freed up in {SLOT_WAIT_S:g} s ({refused} replies 429)"
                    await resp.aread()
                    await asyncio.sleep(0.02)
                    continue
                assert resp.status_code == 200, await resp.aread()
                if disconnect:
                    return refused
                if not streaming:
                    choices = json.loads(await resp.aread())["choices"]
                    texts = {c["index"]: c["text"] for c in choices}
                    break
                async for line in resp.aiter_lines():
                    if line == "data: [DONE]":
                        break
                    if line.startswith("data: "):
                        assert '"error"' not in line, line
                        for c in json.loads(line[6:])["choices"]:
                            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
                else:
                    raise AssertionError(f"request {i}: the stream ended without [DONE]")
                break
    assert sorted(texts) == list(range(len(prompts) * n))
    for text in texts.values():  # text ends before the first stop string
        assert not any(s in text for s in stop), (text, stop)
    return refused


async def _fan_out_storm(url: str, n: int, concurrency: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        return await asyncio.gather(*[_fan_out_one(client, i, rng, gate) for i in range(n)])


def test_soak_fan_out_stop_strings_and_slot_reuse(start_server, caplog):
    """Prompt lists x n with stop strings under a small sequence budget: slots are taken, refused
    (429) and reused; afterwards every slot, KV block and scheduler queue is back at idle."""
    caplog.set_level(logging.WARNING)
    with start_server(engine_options={"max_num_seqs": 16, "num_blocks": 1024}, max_concurrent_sequences=12,
                      max_sequences_per_request=6) as live:
        refusals = asyncio.run(_fan_out_storm(live.url, FAN_OUT_REQUESTS, concurrency=16, seed=3))
        live.wait_idle(timeout=60)
        assert sum(refusals) > 0  # the budget was contended: requests waited for freed slots
        serving = live.server.config.app.state.serving
        # A stream gives its slots back after its last chunk is written or its disconnect is seen, on the
        # server's loop; the client may have read [DONE] (or left) and the engine gone idle before that.
        deadline = time.monotonic() + 10
        while serving.inflight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (serving.inflight, serving.inflight_sequences, serving.preparer.pending) == (0, 0, 0)
        assert live.kv_full() and live.worker.num_active == 0
        assert _counter(live.url, "vllm:num_requests_running") == 0
        assert _counter(live.url, "vllm:num_requests_waiting") == 0
        full = httpx.post(live.url + "/v1/completions", timeout=60,
                          json={"model": MODEL, "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 2})
        assert full.status_code == 200 and len(full.json()["choices"]) == 6
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, [r.getMessage() for r in errors]


@pytest.fixture(scope="module")
def limited(start_server):
    # A CPU decode step takes milliseconds: 1000 tokens take seconds, far past the 1 s timeout.
    with start_server(engine_options={"max_model_len": 1024}, request_timeout=1.0, max_concurrent_requests=2) as live:
        yield live


LONG = {"model": MODEL, "prompt": "long", "max_tokens": 1000, "ignore_eos": True}


def _wait_engine_idle(live, within: float) -> float:
    start = time.monotonic()
    while live.on_engine(lambda e: e.has_unfinished_requests()):
        assert time.monotonic() - start < within, f"the request still runs {within} s after the client left"
        time.sleep(0.01)
    return time.monotonic() - start


def test_stream_disconnect_aborts_at_once(limited):
    aborted = _counter(limited.url, 'vllm:request_success_total{finished_reason="abort"}')
    with httpx.Client(base_url=limited.url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=dict(LONG, stream=True)) as resp:
            next(line for line in resp.iter_lines() if line.startswith("data: "))
    _wait_engine_idle(limited, within=1.0)
    assert limited.kv_full()
    limited.wait_idle()
    assert _counter(limited.url, 'vllm:request_success_total{finished_reason="abort"}') == aborted + 1


def test_non_streaming_disconnect_aborts(limited):
    aborted = _counter(limited.url, 'vllm:request_success_total{finished_reason="abort"}')
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(limited.url + "/v1/completions", json=LONG, timeout=httpx.Timeout(30, read=0.3))
    _wait_engine_idle(limited, within=1.0)
    assert limited.kv_full()
    limited.wait_idle()
    assert _counter(limited.url, 'vllm:request_success_total{finished_reason="abort"}') == aborted + 1


def test_request_timeout_is_504(limited):
    resp = httpx.post(limited.url + "/v1/completions", json=LONG, timeout=30)
    assert resp.status_code == 504 and resp.json()["error"]["code"] == "timeout"
    with httpx.stream("POST", limited.url + "/v1/completions", json=dict(LONG, stream=True), timeout=30) as resp:
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert '"timeout"' in events[-2] and events[-1] == "data: [DONE]"  # the error event, then the end
    limited.wait_idle()
    assert limited.kv_full()


def test_too_many_requests_is_429(limited):
    with httpx.Client(base_url=limited.url, timeout=30) as client:
        streams = [client.stream("POST", "/v1/completions", json=dict(LONG, stream=True)) for _ in range(2)]
        responses = [s.__enter__() for s in streams]
        try:
            assert [r.status_code for r in responses] == [200, 200]
            busy = httpx.post(limited.url + "/v1/completions", json=LONG, timeout=30)
            assert busy.status_code == 429 and busy.headers["Retry-After"] == "1"
            assert busy.json()["error"]["code"] == "too_many_requests"
        finally:
            for s in streams:
                s.__exit__(None, None, None)
    limited.wait_idle()
    ok = httpx.post(limited.url + "/v1/completions", json=dict(LONG, max_tokens=2), timeout=30)
    assert ok.status_code == 200


def test_graceful_shutdown_is_bounded(start_server):
    with start_server(engine_options={"max_model_len": 1024, "num_blocks": 1024}, shutdown_timeout=1.0) as live:
        engine = live.engine
        results = []

        def stream_long():
            try:
                with httpx.stream("POST", live.url + "/v1/completions", timeout=60,
                                  json=dict(LONG, stream=True)) as resp:
                    results.append([line for line in resp.iter_lines() if line.startswith("data: ")])
            except httpx.HTTPError as exc:  # the server may cut the connection at the end of the grace period
                results.append(exc)

        clients = [threading.Thread(target=stream_long) for _ in range(3)]
        for t in clients:
            t.start()
        deadline = time.monotonic() + 30
        while live.worker.num_active < 3:
            assert time.monotonic() < deadline, "the streams never started"
            time.sleep(0.01)
        start = time.monotonic()
        live.stop(timeout=15)
        assert time.monotonic() - start < 1.0 + 5.0
        for t in clients:
            t.join(10)
        assert len(results) == 3
        for events in results:  # cut short, not finished: the error event, then [DONE]
            assert isinstance(events, list) and events[-1] == "data: [DONE]", events
            assert '"shutting_down"' in events[-2] and '"finish_reason":"length"' not in "".join(events)
        assert not live.worker.ready and live.worker.num_active == 0
        engine.check_invariants()  # the engine thread has exited: safe to inspect directly
        assert engine.kv.pool.num_free == engine.kv.pool.num_blocks
        assert not engine.has_unfinished_requests()



def test_health_is_503_until_the_engine_is_ready(start_server):
    gate = threading.Event()

    def slow_load():
        assert gate.wait(60)
        return LLMEngine(MODEL, dtype="float32", device="cpu", num_blocks=256, max_model_len=128)

    with start_server(engine_factory=slow_load) as live:
        health = httpx.get(live.url + "/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "not_ready"
        busy = httpx.post(live.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
        assert busy.status_code == 503
        assert httpx.get(live.url + "/metrics").status_code == 200
        gate.set()
        assert live.worker.wait_ready(60)
        assert httpx.get(live.url + "/health").status_code == 200
        ok = httpx.post(live.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}, timeout=30)
        assert ok.status_code == 200


def test_engine_failure_fails_requests_and_health(start_server, caplog):
    with start_server() as live:
        def broken_step(**_):
            raise RuntimeError("injected step failure")

        live.engine.step = broken_step  # the engine thread is idle: it picks this up on the next request
        resp = httpx.post(live.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30)
        assert resp.status_code == 500 and resp.json()["error"]["code"] == "internal_error"
        assert httpx.get(live.url + "/health").status_code == 503
        assert "injected step failure" in caplog.text
        retry = httpx.post(live.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2},
                           timeout=30)
        assert retry.status_code == 503


@pytest.mark.gpu
@pytest.mark.parametrize("speculative", [None, {"num_speculative_tokens": 4}], ids=["native", "speculative"])
def test_gpu_soak_and_bench(start_server, tmp_path, speculative):
    """The CUDA engine (bf16, async scheduling, graphs) behind HTTP: the disconnect storm, then rlt-bench."""
    from rlt_runtime.entrypoints import bench

    options = {"device": "cuda", "dtype": "auto", "max_num_seqs": 64, "num_blocks": 2048, "max_model_len": 512,
               "speculative_config": speculative}
    with start_server(engine_options=options) as live:
        outcomes = asyncio.run(_storm(live.url, SOAK_REQUESTS, seed=2))
        assert len(outcomes) == SOAK_REQUESTS
        live.wait_idle(timeout=60)
        assert live.kv_full()
        result = tmp_path / "bench.json"
        assert bench.main(["serve", "--base-url", live.url, "--num-prompts", "64", "--random-input-len", "128",
                           "--random-output-len", "32", "--ignore-eos", "--request-rate", "200",
                           "--result-file", str(result)]) == 0
        report = json.loads(result.read_text())
        assert report["completed"] == 64 and report["total_output_tokens"] == 64 * 32
        live.wait_idle()
        assert live.kv_full()
