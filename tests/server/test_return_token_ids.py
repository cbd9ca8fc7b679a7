"""vLLM's return_token_ids: completions choices carry the prompt's and their generated token ids,
chat responses the prompt's and each choice its own; streamed, each chunk carries its new ids and
the prompt's come once per choice, in its first chunk. The ids are the offline engine's for the
same greedy request (an independent run), and without the flag every field stays null."""

from __future__ import annotations

import json

import httpx
import pytest

from rlt_runtime import SamplingParams

MAX_TOKENS = 6
PROMPT = "The token ids of"


def _offline(server, offline, prompt, chat: bool, n: int = 1, max_tokens: int = MAX_TOKENS):
    stops = list(server.engine.tokenizer.chat_stop_token_ids) if chat else None
    params = SamplingParams(temperature=0, max_tokens=max_tokens, stop_token_ids=stops, n=n)
    return offline.generate([prompt], params, use_tqdm=False)[0]


def _events(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json=dict(body, stream=True), timeout=60) as resp:
        assert resp.status_code == 200
        lines = [line[len("data: "):] for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_completions_carry_prompt_and_generated_ids(server, offline):
    ids = httpx.post(server.url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    want = _offline(server, offline, PROMPT, chat=False)
    body = dict(model="ouro-tiny", prompt=[ids, ids[1:]], max_tokens=MAX_TOKENS, temperature=0,
                return_token_ids=True)
    resp = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    first, second = resp["choices"]
    assert first["prompt_token_ids"] == ids and first["token_ids"] == want.outputs[0].token_ids
    assert second["prompt_token_ids"] == ids[1:]
    assert second["token_ids"] == _offline(server, offline, ids[1:], chat=False).outputs[0].token_ids
    assert resp["usage"]["completion_tokens"] == len(first["token_ids"]) + len(second["token_ids"])

    echoed = httpx.post(server.url + "/v1/completions", json=dict(body, prompt=PROMPT, echo=True, max_tokens=0),
                        timeout=60).json()["choices"][0]
    assert echoed["prompt_token_ids"] == ids and echoed["token_ids"] == []

    text = httpx.post(server.url + "/v1/completions", json=dict(body, prompt=PROMPT), timeout=60).json()["choices"][0]
    assert text["prompt_token_ids"] == ids and text["token_ids"] == want.outputs[0].token_ids
    plain = httpx.post(server.url + "/v1/completions", json=dict(body, return_token_ids=None), timeout=60).json()
    assert all(c["prompt_token_ids"] is None and c["token_ids"] is None for c in plain["choices"])


def test_streamed_completions_carry_each_chunks_ids(server, offline):
    want = _offline(server, offline, PROMPT, chat=False)
    events = _events(server, "/v1/completions", dict(model="ouro-tiny", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                     temperature=0, return_token_ids=True))
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert [c["prompt_token_ids"] is not None for c in choices] == [True] + [False] * (len(choices) - 1)
    assert choices[0]["prompt_token_ids"] == want.prompt_token_ids
    assert [t for c in choices for t in c["token_ids"]] == want.outputs[0].token_ids


def test_chat_carries_prompt_ids_on_the_response_and_generated_ids_per_choice(server, offline):
    messages = [{"role": "user", "content": "Say something."}]
    ids = httpx.post(server.url + "/tokenize", json={"messages": messages}).json()["tokens"]
    want = _offline(server, offline, ids, chat=True)
    body = dict(model="ouro-tiny", messages=messages, max_tokens=MAX_TOKENS, temperature=0, return_token_ids=True)
    resp = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert resp["prompt_token_ids"] == ids and resp["choices"][0]["token_ids"] == want.outputs[0].token_ids

    events = _events(server, "/v1/chat/completions", dict(body, n=2))
    for index in (0, 1):
        mine = [e for e in events if e["choices"] and e["choices"][0]["index"] == index]
        assert mine[0]["prompt_token_ids"] == ids and all(e["prompt_token_ids"] is None for e in mine[1:])
        assert [t for e in mine for t in e["choices"][0]["token_ids"] or []] == want.outputs[0].token_ids

    plain = httpx.post(server.url + "/v1/chat/completions", json=dict(body, return_token_ids=False), timeout=60).json()
    assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None
