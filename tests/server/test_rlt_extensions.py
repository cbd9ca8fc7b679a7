"""rlt's HTTP extensions through the official `openai` client: per-token `exit_depths` on every
choice (equal to the offline engine's for the same request) and exit-trace replay by `trace_id`."""

from __future__ import annotations

import httpx
import pytest

from rlt_runtime import SamplingParams

openai = pytest.importorskip("openai")

MODEL = "ouro-tiny"

DEPTH = 4  # ouro-tiny
LOOPY = dict(temperature=0.8, seed=11, max_tokens=8)  # sampled, seeded: batch-independent on both sides
EXTRA = {"ignore_eos": True, "exit_threshold": 0.5}
TRACE = {"a": [4, 1, 3, 2, 4, 1], "b": [4, 2, 2, 1, 3, 3]}


def _offline(llm, prompt, n=1) -> list:
    params = SamplingParams(n=n, ignore_eos=True, exit_threshold=EXTRA["exit_threshold"], **LOOPY)
    return llm.generate([prompt], params, use_tqdm=False)[0].outputs


def _streamed(chunks, n: int) -> tuple[dict, dict]:
    """Per choice index: the concatenated exit depths and the text of a stream."""
    depths, texts = {i: [] for i in range(n)}, {i: "" for i in range(n)}
    for chunk in chunks:
        for ch in chunk.choices:
            depths[ch.index] += ch.model_extra["exit_depths"]
            texts[ch.index] += ch.text if hasattr(ch, "text") else (ch.delta.content or "")
    return depths, texts


def test_completion_exit_depths_match_offline(client, offline):
    want = _offline(offline, "Hello there", n=2)
    assert any(d < DEPTH for c in want for d in c.exit_depths[1:])  # the threshold makes tokens exit early
    resp = client.completions.create(model=MODEL, prompt="Hello there", n=2, extra_body=EXTRA, **LOOPY)
    got = {c.index: c for c in resp.choices}
    for w in want:
        assert got[w.index].model_extra["exit_depths"] == w.exit_depths
        assert got[w.index].text == w.text
    chunks = list(client.completions.create(model=MODEL, prompt="Hello there", n=2, stream=True,
                                            stream_options={"include_usage": True}, extra_body=EXTRA, **LOOPY))
    depths, texts = _streamed(chunks, 2)
    assert depths == {w.index: w.exit_depths for w in want} and texts == {w.index: w.text for w in want}
    assert sum(len(ch.model_extra["exit_depths"]) for c in chunks for ch in c.choices) == chunks[-1].usage.completion_tokens


def test_chat_exit_depths_match_offline(client, server, offline):
    messages = [{"role": "user", "content": "Think hard."}]
    ids = httpx.post(server.url + "/tokenize", json={"messages": messages}).json()["tokens"]
    want = _offline(offline, ids)[0]
    resp = client.chat.completions.create(model=MODEL, messages=messages, extra_body=EXTRA, **LOOPY)
    assert resp.choices[0].model_extra["exit_depths"] == want.exit_depths
    assert resp.choices[0].message.content == want.text
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True, extra_body=EXTRA, **LOOPY))
    assert chunks[0].choices[0].model_extra["exit_depths"] == []  # the opening role chunk adds no token
    depths, texts = _streamed(chunks, 1)
    assert depths[0] == want.exit_depths and texts[0] == want.text


def test_trace_id_replays_the_chosen_entry(start_server):
    with start_server(engine_options={"exit_mode": "trace", "exit_trace": TRACE}) as live:
        cli = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        kw = dict(model=MODEL, max_tokens=6, temperature=0)
        for _ in range(2):  # a second request with the same trace id replays the same entry
            resp = cli.completions.create(prompt="x", extra_body={"ignore_eos": True, "trace_id": "a"}, **kw)
            assert resp.choices[0].model_extra["exit_depths"] == TRACE["a"]
        resp = cli.completions.create(prompt=["x", "y"], extra_body={"ignore_eos": True, "trace_id": ["b", "a"]}, **kw)
        assert [c.model_extra["exit_depths"] for c in resp.choices] == [TRACE["b"], TRACE["a"]]
        chunks = list(cli.chat.completions.create(messages=[{"role": "user", "content": "hi"}], stream=True,
                                                  extra_body={"ignore_eos": True, "trace_id": "b"}, **kw))
        assert _streamed(chunks, 1)[0][0] == TRACE["b"]
        with pytest.raises(openai.BadRequestError) as err:
            cli.completions.create(prompt="x", extra_body={"trace_id": "nope"}, **kw)
        assert err.value.body["param"] == "trace_id" and "'nope' is not in exit_trace" in err.value.body["message"]
        with pytest.raises(openai.BadRequestError) as err:
            cli.completions.create(prompt="x", **kw)
        assert err.value.body["param"] == "trace_id" and "none given" in err.value.body["message"]
        with pytest.raises(openai.BadRequestError) as err:
            cli.completions.create(prompt=["x", "y"], extra_body={"trace_id": "a"}, **kw)
        assert err.value.body["param"] == "trace_id" and "one trace id per prompt (2), got 1" in err.value.body["message"]
        with pytest.raises(openai.BadRequestError) as err:
            cli.completions.create(prompt="x", extra_body={"trace_id": 5}, **kw)
        assert err.value.body["param"] == "trace_id"
        live.wait_idle()
        assert live.kv_full()
