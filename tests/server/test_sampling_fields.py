"""The sampling surface over HTTP through the official `openai` client: presence_penalty,
frequency_penalty, logit_bias, best_of and vLLM's repetition_penalty, min_tokens, bad_words reach
the engine as the offline SamplingParams and give the offline engine's tokens (invalid values are
400s naming the field: test_bad_input.py)."""

from __future__ import annotations

import httpx
import pytest

from rlt_runtime import SamplingParams

openai = pytest.importorskip("openai")

MODEL = "ouro-tiny"
PROMPT = "Hello there, hello there"


def _offline(llm, prompt, **kw):
    return llm.generate([prompt], SamplingParams(**kw), use_tqdm=False)[0].outputs


def test_penalties_and_bias_match_offline(client, offline, submitted_params):
    base = dict(max_tokens=10, temperature=0.0)
    plain = _offline(offline, PROMPT, ignore_eos=True, **base)[0]
    first = plain.token_ids[0]
    fields = dict(presence_penalty=0.5, frequency_penalty=1.0, logit_bias={str(first): -100.0})
    extra = dict(repetition_penalty=1.4, min_tokens=2, bad_words=["hello"], ignore_eos=True)
    want = _offline(offline, PROMPT, **base, **fields | {"logit_bias": {first: -100.0}}, **extra)[0]
    assert want.token_ids != plain.token_ids and want.token_ids[0] != first
    resp = client.completions.create(model=MODEL, prompt=PROMPT, extra_body=extra, **base, **fields)
    assert resp.choices[0].text == want.text
    got = submitted_params[-1]
    assert (got.presence_penalty, got.frequency_penalty, got.repetition_penalty) == (0.5, 1.0, 1.4)
    assert got.logit_bias == {first: -100.0} and got.min_tokens == 2 and got.bad_words == ["hello"]


def test_chat_takes_the_same_fields(client, submitted_params):
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
        presence_penalty=-1.0, frequency_penalty=0.3, logit_bias={"5": 2.0},
        extra_body={"repetition_penalty": 0.9, "min_tokens": 4, "bad_words": ["x y"]})
    assert resp.choices[0].finish_reason == "length"  # min_tokens = max_tokens: nothing may stop it early
    got = submitted_params[-1]
    assert (got.presence_penalty, got.frequency_penalty, got.repetition_penalty, got.min_tokens) == (-1.0, 0.3, 0.9, 4)
    assert got.logit_bias == {5: 2.0} and got.bad_words == ["x y"]


def test_best_of_returns_the_offline_ranking(client, offline):
    kw = dict(max_tokens=6, temperature=1.0, seed=21)
    want = _offline(offline, PROMPT, n=2, best_of=4, ignore_eos=True, **kw)
    resp = client.completions.create(model=MODEL, prompt=PROMPT, n=2, best_of=4, extra_body={"ignore_eos": True}, **kw)
    assert [c.text for c in sorted(resp.choices, key=lambda c: c.index)] == [w.text for w in want]
    assert resp.usage.completion_tokens == sum(len(w.token_ids) for w in want)


def test_penalties_are_a_400_naming_the_field_without_the_penalty_state(start_server):
    with start_server(engine_options={"enable_penalties": False}) as live:
        body = dict(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
        for name, value in (("presence_penalty", 0.5), ("frequency_penalty", 1.0), ("repetition_penalty", 1.2)):
            resp = httpx.post(f"{live.url}/v1/completions", json=body | {name: value}, timeout=30)
            assert resp.status_code == 400, resp.text
            err = resp.json()["error"]
            assert err["param"] == name and "enable_penalties" in err["message"]
        ok = httpx.post(f"{live.url}/v1/completions", json=body | {"logit_bias": {"5": 2.0}, "min_tokens": 2}, timeout=30)
        assert ok.status_code == 200, ok.text
