"""Request bodies real clients send (fixtures/clients/*.json: guidellm's and aiperf's streaming runs
with continuous usage, lm-eval's log-likelihood and generate_until requests, LangChain (chat,
structured output, completions), LiteLLM (chat, text completion), the openai SDK with OpenAI's
newer fields, vLLM extensions), posted to a live server: each is accepted and answered in the shape
its client reads; a json_schema answer is a JSON value the schema validates, its properties in the
schema's order. lm-eval's log-likelihood answer carries the prompt tokens' log-probabilities,
checked against the fp64 dense reference. tests/server/test_real_clients.py runs the clients
themselves."""

from __future__ import annotations

import json
import math
from itertools import accumulate
from pathlib import Path

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")
from openai.types import Completion  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402

from rlt_runtime.models.dense_reference import reference_generate  # noqa: E402
from rlt_runtime.models.presets import preset_config, preset_weights  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "clients"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))
TOL = 1e-4  # fp32 server vs the fp64 reference


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def route(body: dict) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def sse_events(resp: httpx.Response) -> list[dict]:
    """The JSON events of an SSE body, up to `data: [DONE]` (which must end it)."""
    data = [line[len("data: "):] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert data and data[-1] == "[DONE]", resp.text[-200:]
    return [json.loads(d) for d in data[:-1]]


def without_echo_nulls(completion: dict) -> dict:
    """A copy with the echoed first token's null log-probabilities filled in: the API (OpenAI's
    legacy completions and vLLM) sends null there, the openai SDK's type (which the SDK does not
    enforce on responses) lists floats and dicts only."""
    data = json.loads(json.dumps(completion))
    for choice in data["choices"]:
        lp = choice.get("logprobs")
        if lp:
            lp["token_logprobs"] = [0.0 if v is None else v for v in lp["token_logprobs"]]
            lp["top_logprobs"] = [{} if v is None else v for v in lp["top_logprobs"]]
    return data


def validate_chunk(chunk: dict, chat: bool) -> None:
    if chat:
        ChatCompletionChunk.model_validate(chunk)
        return
    data = without_echo_nulls(chunk)  # finish_reason is null until the last chunk (as OpenAI streams it)
    for choice in data["choices"]:
        choice["finish_reason"] = choice["finish_reason"] or "length"
    Completion.model_validate(data)


def max_tokens(body: dict) -> int:
    return body.get("max_completion_tokens", body.get("max_tokens"))


def check_json_schema_answer(body: dict, content: str) -> None:
    """The answer to a response_format json_schema body: a JSON value the schema validates, its
    properties in the schema's order (as OpenAI and vLLM write them)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = body["response_format"]["json_schema"]["schema"]
    value = json.loads(content)
    jsonschema.validate(value, schema)
    keys = json.loads(content, object_pairs_hook=lambda pairs: [k for k, _ in pairs])
    assert keys == [k for k in schema["properties"] if k in keys]


def test_every_client_body_is_a_fixture():
    assert {"guidellm_chat_stream", "guidellm_completions_stream", "guidellm_chat_parts_stream", "aiperf_chat_stream",
            "lm_eval_loglikelihood", "lm_eval_generate_until", "lm_eval_loglikelihood_no_generation", "langchain_chat",
            "langchain_chat_stream", "langchain_chat_json_schema", "langchain_chat_json_mode", "langchain_completions",
            "langchain_completions_stream", "litellm_chat", "litellm_chat_stream", "litellm_text_completion",
            "litellm_text_completion_stream", "openai_sdk_extra_fields"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_client_body_is_answered_in_shape(server, name):
    body = load(name)
    chat = "messages" in body
    resp = httpx.post(server.url + route(body), json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    if not body.get("stream"):
        if chat:
            answer = ChatCompletion.model_validate(resp.json())
            if (body.get("response_format") or {}).get("type") == "json_schema":
                assert answer.choices[0].finish_reason == "stop"
                check_json_schema_answer(body, answer.choices[0].message.content)
        else:
            Completion.model_validate(without_echo_nulls(resp.json()))
        return
    chunks = sse_events(resp)
    for chunk in chunks:
        validate_chunk(chunk, chat)
    options = body.get("stream_options") or {}
    if not options.get("include_usage"):  # no usage anywhere; the last chunk finishes the choice
        assert all(c.get("usage") is None for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        return
    final = chunks[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] >= 1
    continuous = options.get("continuous_usage_stats", False)
    if continuous:  # every chunk: the usage so far, growing to the final one
        done = [c["usage"]["completion_tokens"] for c in chunks]
        assert all(c["usage"]["prompt_tokens"] == final["usage"]["prompt_tokens"] for c in chunks)
        assert all(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
                   for c in chunks)
        assert done == sorted(done) and done[-1] == max_tokens(body)
        with_tokens = [c for c in chunks if c["choices"] and c["choices"][0].get("exit_depths")]
        assert [c["usage"]["completion_tokens"] for c in with_tokens] == list(
            accumulate(len(c["choices"][0]["exit_depths"]) for c in with_tokens))
    else:
        assert all(c.get("usage") is None for c in chunks[:-1])


def reference_prompt_logprobs(prompt: list[int]) -> list[float]:
    """fp64 log-probability of prompt tokens 1.. given the tokens before them (the server's
    ouro-tiny: preset weights, seed 0)."""
    cfg = preset_config("ouro-tiny")
    w = dict(preset_weights(cfg, seed=0, dtype=torch.float64))
    logits = reference_generate(cfg, w, prompt, 1).prompt_logits
    return [float(torch.log_softmax(logits[i], -1)[prompt[i + 1]]) for i in range(len(prompt) - 1)]


@pytest.mark.parametrize("name", ["lm_eval_loglikelihood", "lm_eval_loglikelihood_no_generation"])
def test_lm_eval_loglikelihood_gets_the_prompt_logprobs(server, name):
    body = load(name)
    resp = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    generated = body["max_tokens"]
    assert resp["usage"]["completion_tokens"] == generated * len(body["prompt"])
    for choice, prompt in zip(sorted(resp["choices"], key=lambda c: c["index"]), body["prompt"]):
        lp = choice["logprobs"]
        n = len(prompt) + generated
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        want = reference_prompt_logprobs(prompt)
        got = lp["token_logprobs"][1:len(prompt)]
        assert all(abs(a - b) < TOL for a, b in zip(got, want)), (got, want)
        # What lm-eval reads: the continuation's log-likelihood and whether it is greedy.
        for token_lp, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
            assert math.isfinite(token_lp) and max(top.values()) >= token_lp and len(top) <= 2
        assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
        assert choice["finish_reason"] == "length" and len(choice["exit_depths"]) == generated
        if generated == 0:
            assert choice["text"] == "".join(lp["tokens"])


def test_openai_sdk_reads_echoed_logprobs(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    body = load("lm_eval_loglikelihood")
    resp = client.completions.create(model=body["model"], prompt=body["prompt"], max_tokens=1, logprobs=1, echo=True,
                                     temperature=0)
    lp = resp.choices[0].logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert len(lp.tokens) == len(body["prompt"][0]) + 1 and all(v is not None for v in lp.token_logprobs[1:])


def test_vllm_prompt_logprobs_field(server):
    body = load("vllm_extensions_completions")
    resp = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    prompt_tokens = resp["usage"]["prompt_tokens"]
    entries = resp["choices"][0]["prompt_logprobs"]
    assert len(entries) == prompt_tokens and entries[0] is None
    ids = httpx.post(server.url + "/tokenize", json={"prompt": body["prompt"]}).json()["tokens"]
    want = reference_prompt_logprobs(ids)
    for i, entry in enumerate(entries[1:], 1):
        assert abs(entry[str(ids[i])]["logprob"] - want[i - 1]) < TOL
        ranked = sorted((e for e in entry.values() if e["rank"] is not None), key=lambda e: e["rank"])
        assert [e["rank"] for e in ranked] == [1, 2] and ranked[0]["logprob"] >= ranked[1]["logprob"]
        assert all(e["logprob"] <= ranked[1]["logprob"] for e in entry.values() if e["rank"] is None)


def test_vllm_extensions_reach_the_engine(server, submitted_params):
    body = load("vllm_extensions_completions")
    assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 200
    (params,) = submitted_params
    assert params.prompt_logprobs == 2 and params.skip_special_tokens is False
    assert params.include_stop_str_in_output is True


def test_echo_logprobs_stream_like_the_response(server):
    body = dict(load("lm_eval_loglikelihood"), prompt=load("lm_eval_loglikelihood")["prompt"][:1], max_tokens=3)
    whole = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    chunks = sse_events(httpx.post(server.url + "/v1/completions", json=dict(body, stream=True), timeout=60))
    streamed = {"text": "", "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks:
        for choice in chunk["choices"]:
            streamed["text"] += choice["text"]
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                streamed[key] += choice["logprobs"][key]
    assert streamed["text"] == whole["text"]
    assert {k: v for k, v in streamed.items() if k != "text"} == whole["logprobs"]
