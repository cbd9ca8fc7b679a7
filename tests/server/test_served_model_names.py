"""Model ids as vLLM serves them: a request without `model` (or with null) goes to the served
model; --served-model-name takes several ids, each a card of /v1/models that requests may name,
and responses carry the first; any other id is a 404 naming `model`."""

from __future__ import annotations

import httpx
import pytest

from rlt_runtime.entrypoints.server.app import ServerConfig
from rlt_runtime.entrypoints.server.cli import build_parser
from rlt_runtime.errors import ConfigError

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def named(start_server):
    with start_server(served_model_name=["ouro-main", "ouro-alias"]) as live:
        yield live


def _post(live, path: str, body: dict) -> httpx.Response:
    return httpx.post(live.url + path, json=body, timeout=60)


def test_a_request_without_a_model_goes_to_the_served_one(named):
    chat = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    for path, body in (("/v1/completions", dict(prompt="Hi", max_tokens=3)), ("/v1/chat/completions", chat),
                       ("/v1/responses", dict(input="Hi", max_output_tokens=3))):
        for model in ({}, {"model": None}):
            resp = _post(named, path, dict(body, **model))
            assert resp.status_code == 200 and resp.json()["model"] == "ouro-main", resp.text


def test_every_served_name_is_a_card_and_answers_as_the_first(named):
    client = openai.OpenAI(base_url=named.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["ouro-main", "ouro-alias"]
    assert client.models.retrieve("ouro-alias").id == "ouro-alias"
    out = client.completions.create(model="ouro-alias", prompt="Hi", max_tokens=2)
    assert out.model == "ouro-main"
    with pytest.raises(openai.NotFoundError, match="'ouro-main', 'ouro-alias'"):
        client.completions.create(model="ouro", prompt="Hi", max_tokens=2)


def test_the_flag_and_the_option_are_checked():
    assert build_parser().parse_args(["--model", "m", "--served-model-name", "a", "b"]).served_model_name == ["a", "b"]
    for bad in ("", [], ["a", ""], 3):
        with pytest.raises(ConfigError, match="served_model_name must be"):
            ServerConfig(served_model_name=bad).validate()
