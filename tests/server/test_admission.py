"""Request admission: prompts x n counted against the limits before any tokenization, strict JSON
bodies (UTF-8, nesting depth), preparation off the event loop with a bounded queue, API-key auth."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading

import httpx
import pytest

from rlt_runtime.entrypoints.server.cli import api_key_from, build_parser, warn_if_exposed
from rlt_runtime.entrypoints.server.json_body import nesting_depth
from rlt_runtime.entrypoints.server.preparation import Preparer
from rlt_runtime.entrypoints.server.protocol import ApiError

MODEL = "ouro-tiny"
KEY = "admission-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMITS = dict(max_prompts_per_request=4, max_sequences_per_request=8, max_concurrent_sequences=8, api_key=KEY)


@pytest.fixture(scope="module")
def admission(start_server):
    with start_server(**LIMITS) as live:
        yield live


@pytest.fixture
def http(admission):
    with httpx.Client(base_url=admission.url, headers=AUTH, timeout=60) as client:
        yield client


def _serving(live):
    return live.server.config.app.state.serving


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


class _GatedEncode:
    """Replaces tokenizer.encode: texts containing "SLOW" block until `gate` is set (at most `wait` s)."""

    def __init__(self, tokenizer, wait: float = 15.0):
        self.encode, self.wait = tokenizer.encode, wait
        self.calls = 0
        self.entered, self.gate, self.returned = threading.Event(), threading.Event(), threading.Event()

    def __call__(self, text, **kwargs):
        self.calls += 1
        if "SLOW" in text:
            self.entered.set()
            self.gate.wait(self.wait)
            self.returned.set()
        return self.encode(text, **kwargs)


@pytest.fixture
def gated(admission, monkeypatch) -> _GatedEncode:
    tok = admission.engine.tokenizer
    spy = _GatedEncode(tok)
    monkeypatch.setattr(tok, "encode", spy)
    yield spy
    spy.gate.set()


def _post_in_thread(url: str, body: dict, results: list) -> threading.Thread:
    def post():
        results.append(httpx.post(url + "/v1/completions", json=body, headers=AUTH, timeout=60))
    t = threading.Thread(target=post)
    t.start()
    return t


# ---- fan-out ---------------------------------------------------------------------------------------

def test_fan_out_caps_are_400_before_tokenizing(http, gated):
    err = _error(http.post("/v1/completions", json={"model": MODEL, "prompt": ["a"] * 5, "max_tokens": 1}), 400)
    assert err["param"] == "prompt" and err["code"] == "too_many_prompts" and "4" in err["message"]
    err = _error(http.post("/v1/completions", json={"model": MODEL, "prompt": ["a"] * 3, "n": 3, "max_tokens": 1}), 400)
    assert err["param"] == "n" and err["code"] == "too_many_sequences" and "9" in err["message"]
    err = _error(http.post("/v1/chat/completions", json={"model": MODEL, "n": 9, "max_tokens": 1,
                                                         "messages": [{"role": "user", "content": "a"}]}), 400)
    assert err["param"] == "n" and err["code"] == "too_many_sequences"
    assert gated.calls == 0  # refused from the request's shape: nothing was tokenized
    ok = http.post("/v1/completions", json={"model": MODEL, "prompt": ["a", "b"], "n": 4, "max_tokens": 1})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 8


def test_sequences_count_against_the_concurrency_budget(admission, http, gated):
    results: list = []
    holder = _post_in_thread(admission.url, {"model": MODEL, "prompt": ["SLOW", "b"], "n": 3, "max_tokens": 1},
                             results)
    assert gated.entered.wait(30)  # 6 of the 8 sequence slots are held while it tokenizes
    assert _serving(admission).inflight_sequences == 6
    busy = http.post("/v1/completions", json={"model": MODEL, "prompt": "a", "n": 3, "max_tokens": 1})
    err = _error(busy, 429)
    assert err["code"] == "too_many_requests" and busy.headers["Retry-After"] == "1"
    fits = http.post("/v1/completions", json={"model": MODEL, "prompt": "a", "n": 2, "max_tokens": 1})
    assert fits.status_code == 200, fits.text
    gated.gate.set()
    holder.join(60)
    assert results[0].status_code == 200 and len(results[0].json()["choices"]) == 6
    admission.wait_idle()
    assert (_serving(admission).inflight, _serving(admission).inflight_sequences) == (0, 0)
    again = http.post("/v1/completions", json={"model": MODEL, "prompt": ["a", "b"], "n": 4, "max_tokens": 1})
    assert again.status_code == 200  # the whole budget is free again


# ---- preparation off the event loop ----------------------------------------------------------------

def test_slow_preparation_does_not_stall_a_running_stream(admission, http, gated):
    results: list = []
    slow = _post_in_thread(admission.url, {"model": MODEL, "prompt": "SLOW", "max_tokens": 1}, results)
    assert gated.entered.wait(30)
    body = {"model": MODEL, "prompt": "fast", "max_tokens": 24, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as resp:
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    # The stream ran to its end while the other request was still stuck in tokenization.
    assert not gated.returned.is_set()
    assert events[-1] == "data: [DONE]" and len(events) >= 2
    gated.gate.set()
    slow.join(60)
    assert results[0].status_code == 200


def test_full_preparation_queue_is_503(start_server, monkeypatch):
    with start_server(prepare_threads=1, max_pending_preparations=1) as live:
        tok = live.engine.tokenizer
        spy = _GatedEncode(tok)
        monkeypatch.setattr(tok, "encode", spy)
        results: list = []
        first = threading.Thread(target=lambda: results.append(httpx.post(
            live.url + "/v1/completions", json={"model": MODEL, "prompt": "SLOW", "max_tokens": 1}, timeout=60)))
        first.start()
        try:
            assert spy.entered.wait(30)
            busy = httpx.post(live.url + "/tokenize", json={"prompt": "x"}, timeout=30)
            err = _error(busy, 503)
            assert err["code"] == "overloaded" and busy.headers["Retry-After"] == "1"
        finally:
            spy.gate.set()
            first.join(60)
        assert results[0].status_code == 200
        assert httpx.post(live.url + "/tokenize", json={"prompt": "x"}, timeout=30).status_code == 200


def test_preparation_after_shutdown_is_503():
    async def after_shutdown():
        preparer = Preparer(threads=1, max_pending=2)
        assert await preparer.run(lambda x: x + 1, 1) == 2
        preparer.shutdown()
        with pytest.raises(ApiError) as err:
            await preparer.run(lambda: 1)
        return err.value, preparer.pending

    err, pending = asyncio.run(after_shutdown())
    assert (err.status, err.code, pending) == (503, "shutting_down", 0)


# ---- JSON bodies ---------------------------------------------------------------------------------

def test_invalid_utf8_names_the_byte(http):
    raw = b'{"model": "ouro-tiny", "prompt": "ab\xff", "max_tokens": 1}'
    err = _error(http.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"}), 400)
    assert err["code"] == "invalid_json" and f"UTF-8 at byte {raw.index(0xff)}" in err["message"]


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deep_nesting_is_invalid_json(http, opener):
    raw = '{"model": "ouro-tiny", "prompt": "a", "logit_bias": ' + opener * 100_000
    err = _error(http.post("/v1/completions", content=raw.encode(), headers={"Content-Type": "application/json"}), 400)
    assert err["code"] == "invalid_json" and "at most 32 levels" in err["message"]


def test_brackets_inside_strings_do_not_count(http):
    resp = http.post("/v1/completions", json={"model": MODEL, "prompt": '[' * 40 + '"x\\', "max_tokens": 1})
    assert resp.status_code == 200, resp.text


def _reference_depth(value) -> int:
    if isinstance(value, list):
        return 1 + max((_reference_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_reference_depth(v) for v in value.values()), default=0)
    return 0


def _random_json(rng: random.Random, depth: int):
    kind = rng.randrange(6) if depth < 6 else rng.randrange(3)
    if kind == 0:
        return "".join(rng.choice('ab[]{}"\\\n\u00e9,:') for _ in range(rng.randrange(8)))
    if kind == 1:
        return rng.randrange(100)
    if kind == 2:
        return None
    if kind in (3, 4):
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {str(i) + rng.choice('[{"\\'): _random_json(rng, depth + 1)
            for i in range(rng.randrange(4))}


def test_nesting_depth_matches_the_parsed_value():
    rng = random.Random(0)
    for _ in range(300):
        value = _random_json(rng, 0)
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
        assert nesting_depth(text.encode()) == _reference_depth(value), text


# ---- API key -------------------------------------------------------------------------------------

def test_bearer_scheme_is_case_insensitive_and_401_names_it(admission):
    for scheme in ("bearer", "BEARER", "Bearer"):
        resp = httpx.post(admission.url + "/tokenize", json={"prompt": "x"},
                          headers={"Authorization": f"{scheme} {KEY}"}, timeout=30)
        assert resp.status_code == 200, (scheme, resp.text)
    for header in ({}, {"Authorization": f"Basic {KEY}"}, {"Authorization": "Bearer wrong"}):
        resp = httpx.post(admission.url + "/tokenize", json={"prompt": "x"}, headers=header, timeout=30)
        assert _error(resp, 401)["code"] == "invalid_api_key" and resp.headers["WWW-Authenticate"] == "Bearer"


def test_api_key_from_flag_file_or_environment(tmp_path):
    parse = build_parser().parse_args
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert api_key_from(parse(["--model", "m", "--api-key", "flag"]), {"RLT_API_KEY": "env"}) == "flag"
    assert api_key_from(parse(["--model", "m", "--api-key-file", str(key_file)]), {"RLT_API_KEY": "env"}) == "from-file"
    assert api_key_from(parse(["--model", "m"]), {"RLT_API_KEY": "env"}) == "env"
    assert api_key_from(parse(["--model", "m"]), {}) is None
    with pytest.raises(SystemExit):  # one source on the command line, not both
        parse(["--model", "m", "--api-key", "a", "--api-key-file", str(key_file)])
    (tmp_path / "empty").write_text("\n")
    for bad in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(Exception, match="--api-key-file"):
            api_key_from(parse(["--model", "m", "--api-key-file", str(bad)]), {})


def test_warns_when_exposed_without_a_key(caplog):
    caplog.set_level(logging.WARNING, logger="rlt.server")
    for host, key in (("127.0.0.1", None), ("localhost", None), ("::1", None), ("0.0.0.0", "k")):
        warn_if_exposed(host, key)
    assert not caplog.records
    for host in ("0.0.0.0", "192.168.1.4", "::", "example.org"):
        warn_if_exposed(host, None)
    assert len(caplog.records) == 4 and all("without an API key" in r.getMessage() for r in caplog.records)
