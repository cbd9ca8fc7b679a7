"""SageMaker's POST /invocations, routed as vLLM routes it: `messages` answers as
/v1/chat/completions, `prompt` as /v1/completions (same bodies, same answers, streaming too);
anything else is a 400; it sits behind the API key."""

from __future__ import annotations

import json

import httpx

from conftest import MODEL

CHAT = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0, seed=1)
COMPLETION = dict(prompt="Hello there", max_tokens=5, temperature=0, seed=1)  # (no model: the served one)


def _answer(resp: httpx.Response) -> dict:
    assert resp.status_code == 200, resp.text
    body = resp.json()
    return {k: body[k] for k in ("object", "model", "choices")}


def test_invocations_answer_as_the_endpoint_their_body_is_for(server):
    post = lambda path, body: httpx.post(server.url + path, json=body, timeout=60)  # noqa: E731
    assert _answer(post("/invocations", CHAT)) == _answer(post("/v1/chat/completions", CHAT))
    assert _answer(post("/invocations", COMPLETION)) == _answer(post("/v1/completions", COMPLETION))
    streamed = post("/invocations", dict(COMPLETION, stream=True))
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"])
    assert text == post("/v1/completions", COMPLETION).json()["choices"][0]["text"]


def test_other_bodies_are_400s_and_the_key_is_checked(server, start_server):
    for body in ({"input": "Hi"}, [1, 2]):
        resp = httpx.post(server.url + "/invocations", json=body, timeout=60)
        assert resp.status_code == 400 and "'messages'" in resp.json()["error"]["message"]
    bad = httpx.post(server.url + "/invocations", json=dict(COMPLETION, max_tokens=-1), timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    with start_server(api_key="secret") as live:
        assert httpx.post(live.url + "/invocations", json=COMPLETION, timeout=60).status_code == 401
