"""Bad requests get the right 4xx with the OpenAI error body naming the field; the server stays healthy.

Unknown-field policy under test: a field the server does not know is a 400 naming it (the
OpenAI API does the same); OpenAI fields without an engine feature are accepted only at their
neutral value (the fields accepted and ignored: test_field_policy.py).
"""

from __future__ import annotations

import json

import httpx
import pytest

KEY = "secret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_LIMIT = 4096
OK = {"model": "ouro-tiny", "prompt": "hi", "max_tokens": 2}
CHAT = {"model": "ouro-tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2}


@pytest.fixture(scope="module")
def guarded(start_server):
    with start_server(api_key=KEY, max_body_bytes=BODY_LIMIT, cors_origins=("http://ok.example",)) as live:
        yield live


@pytest.fixture(scope="module")
def http(guarded):
    with httpx.Client(base_url=guarded.url, headers=AUTH, timeout=30) as client:
        yield client


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def _with(**fields):
    body = dict(OK)
    for key, value in fields.items():
        if value is _DROP:
            body.pop(key)
        else:
            body[key] = value
    return body


_DROP = object()

COMPLETION_CASES = [
    ("wrong type prompt", _with(prompt=5), "prompt"),
    ("mixed prompt list", _with(prompt=[1, "a"]), "prompt"),
    ("string max_tokens", _with(max_tokens="5"), "max_tokens"),
    ("float n", _with(n=1.5), "n"),
    ("string temperature", _with(temperature="hot"), "temperature"),
    ("string stream", _with(stream="yes"), "stream"),
    ("bool logprobs", _with(logprobs=True), "logprobs"),
    ("numeric stop", _with(stop=5), "stop"),
    ("empty stop string", _with(stop=[""]), "stop"),
    ("negative max_tokens", _with(max_tokens=-1), "max_tokens"),
    ("zero max_tokens", _with(max_tokens=0), "max_tokens"),
    ("huge max_tokens", _with(max_tokens=10**12), "max_tokens"),
    ("beyond int64 max_tokens", _with(max_tokens=2**70), "max_tokens"),
    ("unknown field", _with(max_token=5), "max_token"),
    ("unknown nested field", _with(stream=True, stream_options={"include_usage": True, "extra": 1}),
     "stream_options.extra"),
    ("missing prompt", _with(prompt=_DROP), "prompt"),
    ("empty prompt", _with(prompt=""), "prompt"),
    ("empty prompt list", _with(prompt=[]), "prompt"),
    ("empty token list", _with(prompt=[[]]), "prompt"),
    ("out-of-vocab token", _with(prompt=[1, 999_999]), "prompt"),
    ("negative token", _with(prompt=[-1]), "prompt"),
    ("min_loops above max_loops", _with(min_loops=3, max_loops=2), "min_loops"),
    ("zero min_loops", _with(min_loops=0), "min_loops"),
    ("max_loops above depth", _with(max_loops=99), "max_loops"),
    ("exit_threshold above 1", _with(exit_threshold=2.0), "exit_threshold"),
    ("negative temperature", _with(temperature=-1.0), "temperature"),
    ("zero top_p", _with(top_p=0.0), "top_p"),
    ("bad top_k", _with(top_k=-5), "top_k"),
    ("huge top_k", _with(top_k=254969639664320782532608), "top_k"),
    ("too many logprobs", _with(logprobs=21), "logprobs"),
    ("zero n", _with(n=0), "n"),
    ("negative seed", _with(seed=-1), "seed"),
    ("best_of below n", _with(n=2, best_of=1), "best_of"),
    ("best_of above 64", _with(best_of=65), "best_of"),
    ("streamed best_of above n", _with(best_of=3, stream=True), "best_of"),
    ("presence penalty above 2", _with(presence_penalty=2.5), "presence_penalty"),
    ("frequency penalty below -2", _with(frequency_penalty=-2.5), "frequency_penalty"),
    ("zero repetition penalty", _with(repetition_penalty=0.0), "repetition_penalty"),
    ("logit bias above 100", _with(logit_bias={"1": 100.5}), "logit_bias"),
    ("logit bias key not a token id", _with(logit_bias={"one": 5.0}), "logit_bias"),
    ("logit bias token out of vocabulary", _with(logit_bias={"999999": 5.0}), "logit_bias"),
    ("negative min_tokens", _with(min_tokens=-1), "min_tokens"),
    ("min_tokens above max_tokens", _with(min_tokens=9, max_tokens=4), "min_tokens"),
    ("empty bad word", _with(bad_words=[""]), "bad_words[0]"),
    ("bad word too long", _with(bad_words=["a b c d e f g h i j k l m n o p"]), "bad_words"),
    ("suffix", _with(suffix="tail"), "suffix"),
    ("prompt_logprobs above 20", _with(prompt_logprobs=21), "prompt_logprobs"),
    ("stream_options without stream", _with(stream_options={"include_usage": True}), "stream_options"),
    ("string speculative", _with(speculative="no"), "speculative"),
]


@pytest.mark.parametrize("name,body,param", COMPLETION_CASES, ids=[c[0] for c in COMPLETION_CASES])
def test_completion_field_errors(http, name, body, param):
    err = _error(http.post("/v1/completions", json=body), 400)
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error"


CHAT_CASES = [
    ("no messages", dict(CHAT, messages=[]), "messages"),
    ("missing messages", {k: v for k, v in CHAT.items() if k != "messages"}, "messages"),
    ("unknown role", dict(CHAT, messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
    ("numeric content", dict(CHAT, messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    ("image part", dict(CHAT, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]),
     "messages[0].content[0].type"),
    ("tool message without its call's id", dict(CHAT, messages=[{"role": "tool", "content": "x"}]),
     "messages[0].tool_call_id"),
    ("tools with the default tool_choice (auto)", dict(CHAT, tools=[{"type": "function", "function": {"name": "f"}}]),
     "tool_choice"),
    ("tool of another type", dict(CHAT, tools=[{"type": "code_interpreter"}], tool_choice="none"), "tools[0].type"),
    ("unknown response_format", dict(CHAT, response_format={"type": "yaml"}), "response_format"),
    ("top_logprobs without logprobs", dict(CHAT, top_logprobs=2), "top_logprobs"),
    ("streamed prompt_logprobs", dict(CHAT, stream=True, prompt_logprobs=1), "prompt_logprobs"),
    ("huge max_completion_tokens", dict(CHAT, max_completion_tokens=10**9), "max_completion_tokens"),
    ("unknown field", dict(CHAT, temprature=0.5), "temprature"),
]


@pytest.mark.parametrize("name,body,param", CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_chat_field_errors(http, name, body, param):
    err = _error(http.post("/v1/chat/completions", json=body), 400)
    assert err["param"] == param, err


@pytest.mark.parametrize("raw", ['{"model": ', "[1, 2]", "", "null", '"text"', "\xff\xfe"])
def test_malformed_bodies(http, raw):
    resp = http.post("/v1/completions", content=raw.encode("latin-1"), headers={"Content-Type": "application/json"})
    err = _error(resp, 400)
    assert err["param"] is None


@pytest.mark.parametrize("route,raw,param", [
    ("/v1/completions", '{"model": "ouro-tiny", "prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    ("/v1/chat/completions", '{"model": "ouro-tiny", "messages": [{"role": "user", "content": "\\udc00"}]}', "messages"),
    ("/tokenize", '{"prompt": "\\ud83d"}', "prompt"),
])
def test_lone_surrogate_escapes_are_400(http, route, raw, param):
    """JSON may spell a lone surrogate ("\\ud800"); it is not text and must not reach the tokenizer."""
    resp = http.post(route, content=raw.encode(), headers={"Content-Type": "application/json"})
    assert _error(resp, 400)["param"] == param


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_non_json_content_type(http, content_type):
    resp = http.post("/v1/completions", content=json.dumps(OK), headers={"Content-Type": content_type})
    assert _error(resp, 400)["code"] == "invalid_content_type"


def test_unknown_model_is_404(http):
    err = _error(http.post("/v1/completions", json=_with(model="gpt-4o")), 404)
    assert err["param"] == "model" and err["code"] == "model_not_found"
    assert _error(http.get("/v1/models/gpt-4o"), 404)["param"] == "model"


def test_prompt_longer_than_context_names_both_lengths(http, guarded):
    limit = guarded.engine.max_model_len
    err = _error(http.post("/v1/completions", json=_with(prompt=list(range(3, 3 + limit + 5)))), 400)
    assert err["param"] == "prompt" and err["code"] == "context_length_exceeded"
    assert str(limit + 5) in err["message"] and str(limit) in err["message"]


def test_api_key(guarded):
    assert _error(httpx.post(guarded.url + "/v1/completions", json=OK), 401)["code"] == "invalid_api_key"
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(guarded.url + "/v1/completions", json=OK, headers=wrong).status_code == 401
    assert httpx.post(guarded.url + "/tokenize", json={"prompt": "x"}).status_code == 401
    assert httpx.get(guarded.url + "/v1/models").status_code == 401
    assert httpx.get(guarded.url + "/health").status_code == 200
    assert httpx.get(guarded.url + "/metrics").status_code == 200
    assert httpx.get(guarded.url + "/ping").status_code == httpx.get(guarded.url + "/version").status_code == 200


def test_oversized_body_is_413(http):
    big = json.dumps(_with(prompt="x" * (BODY_LIMIT + 10)))
    assert _error(http.post("/v1/completions", content=big, headers={"Content-Type": "application/json"}),
                  413)["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit is enforced while reading
        for i in range(0, len(big), 1000):
            yield big[i:i + 1000].encode()

    _error(http.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}), 413)


def test_tokenizer_endpoint_errors(http):
    assert _error(http.post("/tokenize", json={"prompt": "a", "messages": [{"role": "user", "content": "b"}]}),
                  400)["param"] == "prompt"
    assert _error(http.post("/tokenize", json={}), 400)["param"] == "prompt"
    assert _error(http.post("/detokenize", json={"tokens": [1, 10**6]}), 400)["param"] == "tokens"
    assert _error(http.post("/detokenize", json={"tokens": "abc"}), 400)["param"] == "tokens"


def test_wrong_route_and_method(http):
    assert _error(http.get("/v1/completions"), 405)
    assert _error(http.post("/v1/nothing", json={}), 404)


def test_server_healthy_after_bad_input(http, guarded):
    assert http.get("/health").status_code == 200
    resp = http.post("/v1/completions", json=OK)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1
    guarded.wait_idle()
    assert guarded.kv_full()


def test_cors_only_for_configured_origins(guarded):
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    ok = httpx.options(guarded.url + "/v1/completions", headers={"Origin": "http://ok.example", **preflight})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://ok.example"
    evil = httpx.options(guarded.url + "/v1/completions", headers={"Origin": "http://evil.example", **preflight})
    assert "access-control-allow-origin" not in evil.headers


def test_too_many_stop_strings_is_400_naming_stop(http):
    """Default max_stop_strings is 128; the body stays under this server's 4 KiB limit."""
    err = _error(http.post("/v1/completions", json=_with(stop=[chr(0x4E00 + i) for i in range(129)])), 400)
    assert err["param"] == "stop" and "128" in err["message"] and "max_stop_strings" in err["message"]
    chat = dict(CHAT, stop=[chr(0x4E00 + i) for i in range(129)])
    assert _error(http.post("/v1/chat/completions", json=chat), 400)["param"] == "stop"


def test_stop_characters_over_the_engine_limit_is_400_naming_stop(start_server):
    with start_server(engine_options={"max_stop_strings": 4, "max_stop_chars": 32}) as live:
        resp = httpx.post(live.url + "/v1/completions", json=_with(stop=["x" * 20, "y" * 13]), timeout=30)
        err = _error(resp, 400)
        assert err["param"] == "stop" and "33" in err["message"] and "32" in err["message"]
        assert "max_stop_chars" in err["message"]
        ok = httpx.post(live.url + "/v1/completions", json=_with(stop=["x" * 20, "y" * 12]), timeout=30)
        assert ok.status_code == 200, ok.text
        live.wait_idle()
        assert live.kv_full()
