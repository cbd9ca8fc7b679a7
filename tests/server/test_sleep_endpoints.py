"""vLLM's sleep-mode endpoints: POST /sleep?level=, POST /wake_up?tags=, GET /is_sleeping. While
asleep generation requests get 503 `not_ready` (the official openai client sees it) and the server
stays up; after waking the answers are the offline engine's; bad levels and tags are 400s naming the
parameter; the endpoints sit behind the API key; without --enable-sleep-mode /sleep is refused."""

from __future__ import annotations

import httpx
import pytest

from conftest import MODEL, OFFLINE
from rlt_runtime import LLM, SamplingParams

openai = pytest.importorskip("openai")

PROMPT = list(range(40, 60))


@pytest.fixture(scope="module")
def sleepy(start_server):
    with start_server(engine_options={"enable_sleep_mode": True}) as live:
        yield live


def _complete(live) -> httpx.Response:
    return httpx.post(live.url + "/v1/completions", json=dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                                              ignore_eos=True, return_token_ids=True), timeout=60)


def test_asleep_requests_get_503_and_woken_answers_match_offline(sleepy):
    want = LLM(MODEL, **OFFLINE).generate([PROMPT], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                                         use_tqdm=False)[0].outputs[0].token_ids
    assert _complete(sleepy).json()["choices"][0]["token_ids"] == want
    slept = httpx.post(sleepy.url + "/sleep", params={"level": 1}, timeout=60)
    assert slept.status_code == 200 and slept.json()["is_sleeping"] and slept.json()["bytes_released"] > 0
    assert httpx.get(sleepy.url + "/is_sleeping", timeout=60).json() == {"is_sleeping": True}
    refused = _complete(sleepy)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
    assert "POST /wake_up" in refused.json()["error"]["message"]
    client = openai.OpenAI(base_url=sleepy.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert httpx.get(sleepy.url + "/health", timeout=60).status_code == 200  # (up, only asleep)
    woke = httpx.post(sleepy.url + "/wake_up", params={"tags": "weights"}, timeout=60)
    assert woke.json() == {"is_sleeping": True}  # the KV cache is still away
    assert _complete(sleepy).status_code == 503
    assert httpx.post(sleepy.url + "/wake_up", timeout=60).json() == {"is_sleeping": False}
    assert _complete(sleepy).json()["choices"][0]["token_ids"] == want


@pytest.mark.parametrize("path,params,param,text", [
    ("/sleep", {"level": 3}, "level", "level must be 1 or 2, got '3'"),
    ("/sleep", {"level": "x"}, "level", "level must be 1 or 2"),
    ("/wake_up", {"tags": "kv"}, "tags", "wake_up tags must be among ['weights', 'kv_cache'], got ['kv']"),
])
def test_bad_parameters_are_400s_naming_them(sleepy, path, params, param, text):
    resp = httpx.post(sleepy.url + path, params=params, timeout=60)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param
    assert text in resp.json()["error"]["message"]


def test_sleep_mode_off_and_the_api_key(server, start_server):
    resp = httpx.post(server.url + "/sleep", timeout=60)
    assert resp.status_code == 400 and "enable_sleep_mode=True" in resp.json()["error"]["message"]
    assert _complete(server).status_code == 200
    with start_server(api_key="secret", engine_options={"enable_sleep_mode": True}) as live:
        for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
            assert httpx.request(method, live.url + path, timeout=60).status_code == 401
        auth = {"Authorization": "Bearer secret"}
        assert httpx.post(live.url + "/sleep", headers=auth, timeout=60).status_code == 200
        assert httpx.post(live.url + "/wake_up", headers=auth, timeout=60).json() == {"is_sleeping": False}
