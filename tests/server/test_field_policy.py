"""The request-field policy (field_policy.py): OpenAI fields and vLLM extensions that cannot
apply here are accepted and ignored with one warning per name and process; vLLM extensions for
missing features are accepted at their neutral value only (else 400 `unsupported`); names of
neither are a 400 `unknown_field` naming them; implemented extensions reach the engine."""

from __future__ import annotations

import logging

import httpx
import pytest

from rlt_runtime.engine.llm_engine import LLMEngine
from rlt_runtime.entrypoints.server import field_policy
from rlt_runtime.entrypoints.server.protocol import ChatCompletionRequest, CompletionRequest

from conftest import ENGINE_DEFAULTS

COMPLETION = {"model": "ouro-tiny", "prompt": "hi", "max_tokens": 2}
CHAT = {"model": "ouro-tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2}
SAMPLE_VALUES = {"metadata": {"k": "v"}, "modalities": ["text"], "parallel_tool_calls": True, "store": True,
                 "cache_salt": "s", "kv_transfer_params": {}, "vllm_xargs": {}, "mm_processor_kwargs": {},
                 "ec_transfer_params": {}, "return_token_offsets": True}


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which names have been warned about (the set lives for the process)."""
    monkeypatch.setattr(field_policy, "_warned", set())


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def _error(resp: httpx.Response) -> dict:
    assert resp.status_code == 400, resp.text
    return resp.json()["error"]


def test_the_lists_do_not_overlap_the_models():
    declared = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    assert not field_policy.IGNORED & declared
    assert not set(field_policy.NEUTRAL_ONLY) & declared
    assert not field_policy.IGNORED & set(field_policy.NEUTRAL_ONLY)


@pytest.mark.parametrize("name", sorted(field_policy.IGNORED))
@pytest.mark.parametrize("path,body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
def test_ignored_fields_are_accepted(server, path, body, name):
    resp = _post(server, path, dict(body, **{name: SAMPLE_VALUES.get(name, "x")}))
    assert resp.status_code == 200, resp.text


def test_each_ignored_field_warns_once(server, fresh_warnings, caplog):
    with caplog.at_level(logging.WARNING, logger="rlt.server"):
        for _ in range(3):
            assert _post(server, "/v1/chat/completions", dict(CHAT, store=False, verbosity="low")).status_code == 200
        assert _post(server, "/v1/completions", dict(COMPLETION, store=True)).status_code == 200
    warned = [r.getMessage() for r in caplog.records if "accepted and ignored" in r.getMessage()]
    assert sum("'store'" in m for m in warned) == 1 and sum("'verbosity'" in m for m in warned) == 1


@pytest.mark.parametrize("name", ["stor", "max_token", "temprature", "frobnicate", "guided_jsonn"])
@pytest.mark.parametrize("path,body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
def test_unknown_names_are_rejected_by_name(server, path, body, name):
    err = _error(_post(server, path, dict(body, **{name: 1})))
    assert err["code"] == "unknown_field" and err["param"] == name and name in err["message"]


@pytest.mark.parametrize("name,neutral,other", [
    ("guided_whitespace_pattern", None, "[ ]*"),
    ("logprob_token_ids", [], [1]), ("prompt_embeds", None, "AAAA"),
])
def test_neutral_only_fields(server, name, neutral, other):
    assert _post(server, "/v1/chat/completions", dict(CHAT, **{name: neutral})).status_code == 200
    err = _error(_post(server, "/v1/chat/completions", dict(CHAT, **{name: other})))
    assert err["code"] == "unsupported" and err["param"] == name


def test_a_declared_field_wins_over_the_lists():
    assert field_policy.apply_field_policy({"prompt_embeds": True, "store": 1}, {"prompt_embeds", "store"}) == {
        "prompt_embeds": True, "store": 1}
    assert field_policy.apply_field_policy({"prompt_embeds": None, "store": 1, "x": 2}, set()) == {"x": 2}


def test_continuous_usage_needs_include_usage(server):
    body = dict(COMPLETION, stream=True, stream_options={"continuous_usage_stats": True})
    resp = _post(server, "/v1/completions", body)
    assert resp.status_code == 200 and '"usage":{' not in resp.text  # vLLM: usage only with include_usage


@pytest.fixture(scope="module")
def huginn(start_server):
    """A huginn-tiny server: its tokenizer adds <|begin_text|> to text prompts."""
    with start_server(engine_factory=lambda: LLMEngine("huginn-tiny", **ENGINE_DEFAULTS),
                      served_model_name="huginn-tiny") as live:
        live.worker.wait_ready(120)
        yield live


def test_add_special_tokens(huginn):
    def prompt_tokens(body):
        resp = _post(huginn, route, dict(body, model="huginn-tiny"))
        assert resp.status_code == 200, resp.text
        return resp.json()["usage"]["prompt_tokens"]

    route = "/v1/completions"
    assert prompt_tokens(COMPLETION) == prompt_tokens(dict(COMPLETION, add_special_tokens=False)) + 1
    route = "/v1/chat/completions"  # the chat template writes <|begin_text|> itself: off by default
    assert prompt_tokens(dict(CHAT, add_special_tokens=True)) == prompt_tokens(CHAT) + 1
