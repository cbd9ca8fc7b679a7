"""vLLM's request extensions over HTTP: allowed_token_ids, truncate_prompt_tokens with
truncation_side, return_tokens_as_token_ids (per request or rlt-serve
--return-tokens-as-token-ids), use_beam_search with length_penalty, repetition_detection, the
choices' stop_reason, and POST /reset_prefix_cache. Outputs are compared with the offline engine
given the same SamplingParams (or the truncated prompt itself); bad values are 400s naming the field."""

from __future__ import annotations

import json

import httpx
import pytest

from rlt_runtime import SamplingParams

openai = pytest.importorskip("openai")

MODEL = "ouro-tiny"
PROMPT = list(range(40, 60))  # token ids
ALLOWED = [17, 33, 101, 200, 240]


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=dict(body, model=MODEL), timeout=60)


def _offline(llm, prompt, **kw):
    return llm.generate([prompt], SamplingParams(**kw), use_tqdm=False)[0]


def _error(resp: httpx.Response, param: str) -> str:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"].split("[")[0] == param, err  # (or an element of it: allowed_token_ids[1])
    return err["message"]


def test_allowed_token_ids_match_offline_and_hold(server, offline, submitted_params):
    kw = dict(max_tokens=8, temperature=0.0, ignore_eos=True)
    plain = _offline(offline, PROMPT, **kw).outputs[0]
    want = _offline(offline, PROMPT, allowed_token_ids=ALLOWED, **kw).outputs[0]
    assert want.token_ids != plain.token_ids and set(want.token_ids) <= set(ALLOWED)
    body = dict(prompt=PROMPT, max_tokens=8, temperature=0, ignore_eos=True, allowed_token_ids=ALLOWED,
                return_token_ids=True)
    choice = _post(server, "/v1/completions", body).json()["choices"][0]
    assert choice["token_ids"] == want.token_ids and choice["text"] == want.text
    resp = _post(server, "/v1/chat/completions", dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                                      temperature=0, allowed_token_ids=ALLOWED, return_token_ids=True))
    assert set(resp.json()["choices"][0]["token_ids"]) <= set(ALLOWED)
    assert submitted_params[-1].allowed_token_ids == ALLOWED


@pytest.mark.parametrize("value,text", [([], "at least 1"), ([5, -1], "greater than or equal to 0"),
                                        ([5, 10**6], "allowed_token_ids token ids must be in"), ("5", "list")])
def test_bad_allowed_token_ids_name_the_field(server, value, text):
    message = _error(_post(server, "/v1/completions", dict(prompt="Hi", allowed_token_ids=value)), "allowed_token_ids")
    assert text in message


@pytest.mark.parametrize("side", ["left", "right", None])
def test_truncated_prompts_run_the_tokens_kept(client, offline, side):
    kept = PROMPT[:6] if side == "right" else PROMPT[-6:]
    want = _offline(offline, kept, max_tokens=6, temperature=0.0, ignore_eos=True).outputs[0]
    extra = {"truncate_prompt_tokens": 6, "ignore_eos": True, "return_token_ids": True}
    if side is not None:
        extra["truncation_side"] = side
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, echo=True,
                                     extra_body=extra)
    choice = resp.choices[0]
    assert resp.usage.prompt_tokens == 6 and choice.prompt_token_ids == kept
    assert choice.text == offline.tokenizer.decode(kept) + want.text  # echo shows the prompt as run


def test_truncation_applies_before_the_context_check(server, offline):
    text = "Hello there " * 40  # longer than the shared server's context of 128 tokens
    assert _post(server, "/v1/completions", dict(prompt=text, max_tokens=1)).status_code == 400
    resp = _post(server, "/v1/completions", dict(prompt=text, max_tokens=1, truncate_prompt_tokens=-1)).json()
    assert resp["usage"]["prompt_tokens"] == 127
    chat = _post(server, "/v1/chat/completions", dict(messages=[{"role": "user", "content": text}], max_tokens=2,
                                                      truncate_prompt_tokens=20)).json()
    assert chat["usage"]["prompt_tokens"] == 20


@pytest.mark.parametrize("value,text", [(0, "-1 or at least 1"), (-2, "greater than or equal to -1"),
                                        (1.5, "integer")])
def test_bad_truncation_names_the_field(server, value, text):
    assert text in _error(_post(server, "/v1/completions", dict(prompt="Hi", truncate_prompt_tokens=value)),
                          "truncate_prompt_tokens")
    assert "'left' or 'right'" in _error(_post(server, "/v1/completions", dict(
        prompt="Hi", truncate_prompt_tokens=2, truncation_side="middle")), "truncation_side")


def _completion_tokens(live, **body):
    resp = _post(live, "/v1/completions", dict(prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2,
                                               return_token_ids=True, **body))
    choice = resp.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]


def _chat_tokens(live, **body):
    resp = _post(live, "/v1/chat/completions", dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                                    temperature=0, logprobs=True, top_logprobs=2, return_token_ids=True,
                                                    **body))
    choice = resp.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["content"]


def _check_named_by_id(ids, completion_lp, chat_ids, chat_lp, server_tokens):
    assert completion_lp["tokens"] == [f"token_id:{t}" for t in ids]
    assert all(k.startswith("token_id:") for top in completion_lp["top_logprobs"] for k in top)
    assert [e["token"] for e in chat_lp] == [f"token_id:{t}" for t in chat_ids]
    assert all(t["token"].startswith("token_id:") for e in chat_lp for t in e["top_logprobs"])
    assert [e["bytes"] for e in chat_lp] == [list(server_tokens(t).encode()) for t in chat_ids]  # the token's own


def test_return_tokens_as_token_ids(server, offline):
    ids, lp = _completion_tokens(server)
    assert lp["tokens"] == [offline.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    named_ids, named_lp = _completion_tokens(server, return_tokens_as_token_ids=True)
    assert named_ids == ids and named_lp["text_offset"] == lp["text_offset"]
    chat_ids, chat_lp = _chat_tokens(server, return_tokens_as_token_ids=True)
    _check_named_by_id(ids, named_lp, chat_ids, chat_lp, lambda t: offline.tokenizer.decode([t], skip_special_tokens=False))


def test_the_server_option_names_every_request_by_id(start_server, offline):
    with start_server(return_tokens_as_token_ids=True) as live:
        ids, lp = _completion_tokens(live)
        chat_ids, chat_lp = _chat_tokens(live)
        _check_named_by_id(ids, lp, chat_ids, chat_lp, lambda t: offline.tokenizer.decode([t], skip_special_tokens=False))


def test_reset_prefix_cache(server, start_server):
    prompt = list(range(3, 40))  # two full 16-token blocks are cached after it runs
    assert _post(server, "/v1/completions", dict(prompt=prompt, max_tokens=1)).status_code == 200
    first = httpx.post(server.url + "/reset_prefix_cache", timeout=60)
    assert first.status_code == 200 and first.json()["blocks_dropped"] > 0
    assert httpx.post(server.url + "/reset_prefix_cache", timeout=60).json()["blocks_dropped"] == 0
    with start_server(api_key="secret") as live:  # behind the API key, as /v1/* is
        assert httpx.post(live.url + "/reset_prefix_cache", timeout=60).status_code == 401
        assert httpx.post(live.url + "/reset_prefix_cache", headers={"Authorization": "Bearer secret"},
                          timeout=60).status_code == 200


def test_beam_search_answers_with_the_offline_searchs_beams(server, offline):
    from rlt_runtime.beam_search import BeamSearchParams

    want = offline.beam_search([PROMPT], BeamSearchParams(beam_width=3, max_tokens=5, length_penalty=0.5))[0]
    body = dict(prompt=PROMPT, max_tokens=5, n=3, use_beam_search=True, length_penalty=0.5, return_token_ids=True)
    resp = _post(server, "/v1/completions", body).json()
    assert [c["token_ids"] for c in resp["choices"]] == [s.tokens[len(PROMPT):] for s in want.sequences]
    assert [c["text"] for c in resp["choices"]] == [s.text for s in want.sequences]
    assert [c["index"] for c in resp["choices"]] == [0, 1, 2] and resp["usage"]["completion_tokens"] == 15
    chat = _post(server, "/v1/chat/completions", dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=3, n=2,
                                                      use_beam_search=True)).json()
    assert len(chat["choices"]) == 2 and chat["choices"][0]["message"]["content"] != chat["choices"][1]["message"]["content"]


@pytest.mark.parametrize("extra,param", [(dict(stream=True), "stream"), (dict(n=11), "n"), (dict(logprobs=1), "logprobs"),
                                         (dict(guided_regex="[a-z]+"), "guided_regex"), (dict(min_tokens=2), "min_tokens"),
                                         (dict(trace_id="t"), "trace_id")])
def test_beam_search_refuses_what_it_cannot_do_by_name(server, extra, param):
    body = dict(dict(prompt="Hi", max_tokens=3, n=2, use_beam_search=True), **extra)
    _error(_post(server, "/v1/completions", body), param)


def test_length_penalty_needs_beam_search(server):
    _error(_post(server, "/v1/completions", dict(prompt="Hi", length_penalty=0.5)), "length_penalty")
    assert _post(server, "/v1/completions", dict(prompt="Hi", max_tokens=1, length_penalty=1.0)).status_code == 200


def test_repetition_detection_stops_a_repeating_output(server, offline, submitted_params):
    rule = {"max_pattern_size": 3, "min_count": 4}
    kw = dict(max_tokens=20, temperature=0.0, ignore_eos=True)
    want = _offline(offline, PROMPT, repetition_detection=rule, **kw).outputs[0]
    plain = _offline(offline, PROMPT, **kw).outputs[0]
    assert want.finish_reason == "stop" and want.stop_reason == "repetition_detected"
    assert len(want.token_ids) < len(plain.token_ids) and plain.token_ids[:len(want.token_ids)] == want.token_ids
    for extra in ({"repetition_detection": rule}, {"max_repetition_pattern_size": 3, "repetition_min_count": 4}):
        body = dict(prompt=PROMPT, max_tokens=20, temperature=0, ignore_eos=True, return_token_ids=True, **extra)
        choice = _post(server, "/v1/completions", body).json()["choices"][0]
        assert choice["token_ids"] == want.token_ids and choice["finish_reason"] == "stop"
        assert submitted_params[-1].repetition_detection.min_count == 4
    both = dict(prompt="Hi", repetition_detection=rule, repetition_min_count=4)
    _error(_post(server, "/v1/completions", both), "repetition_detection")
    bad = dict(prompt="Hi", repetition_detection={"max_pattern_size": 3, "min_count": 1})
    assert "at least 2" in _error(_post(server, "/v1/completions", bad), "repetition_detection.min_count")


def test_choices_carry_vllms_stop_reason(server, offline):
    """The stop string or stop token id that ended a choice, "repetition_detected", else null (EOS,
    length); streamed, in the chunk that finishes the choice."""
    plain = _offline(offline, PROMPT, max_tokens=12, temperature=0.0, ignore_eos=True).outputs[0]
    stop_id, stop_text = plain.token_ids[3], offline.tokenizer.decode(plain.token_ids[2:4])
    cases = [({"stop_token_ids": [stop_id]}, stop_id), ({"stop": [stop_text]}, stop_text),
             ({"repetition_detection": {"max_pattern_size": 3, "min_count": 4}}, "repetition_detected"), ({}, None)]
    for extra, want in cases:
        body = dict(prompt=PROMPT, max_tokens=12, temperature=0, ignore_eos=True, **extra)
        choice = _post(server, "/v1/completions", body).json()["choices"][0]
        assert choice["stop_reason"] == want, (extra, choice)
        events = httpx.post(server.url + "/v1/completions", json=dict(body, model=MODEL, stream=True), timeout=60)
        chunks = [json.loads(line[6:]) for line in events.text.splitlines() if line.startswith("data: {")]
        assert [c["choices"][0]["stop_reason"] for c in chunks if c["choices"][0]["finish_reason"]] == [want]
    chat = _post(server, "/v1/chat/completions", dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=30,
                                                      temperature=0)).json()["choices"][0]
    assert chat["stop_reason"] is None  # an end-of-turn token or the length limit ended it
