"""Structured output over HTTP with the official `openai` client: response_format json_schema and
json_object on chat and text completions, vLLM's response_format structural_tag (its
structures-and-triggers form and xgrammar's format), vLLM's guided_regex / guided_choice /
guided_grammar / guided_json / structural_tag and its newer structured_outputs in extra_body, the
engine receiving the offline
GuidedDecoding, and 400s naming the field for bad schemas, regexes, grammars, structural tags and
conflicting constraints."""

from __future__ import annotations

import json
import re

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("xgrammar")

from rlt_runtime import GuidedDecoding  # noqa: E402

MODEL = "ouro-tiny"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,4}$"},
                                           "rank": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "rank"], "additionalProperties": False}
CHAT = dict(model=MODEL, messages=[{"role": "user", "content": "Reply in JSON."}], max_tokens=40)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_response_format_json_schema(client, submitted_params):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    resp = client.chat.completions.create(response_format=fmt, temperature=1.0, seed=3, **CHAT)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    obj = json.loads(choice.message.content)
    assert set(obj) == {"city", "rank"} and re.fullmatch("[a-z]{1,4}", obj["city"])
    assert isinstance(obj["rank"], int) and 1 <= obj["rank"] <= 9
    assert submitted_params[-1].guided == GuidedDecoding(json=SCHEMA)



def test_properties_come_in_the_schema_order(client):
    """The output writes an object's properties in the order the schema lists them, as OpenAI and
    vLLM do (a schema that puts "reasoning" before "answer" relies on it), not sorted by name."""
    props = SCHEMA["properties"]
    schema = dict(SCHEMA, properties={"rank": props["rank"], "city": props["city"]}, required=["rank", "city"])
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    resp = client.chat.completions.create(response_format=fmt, temperature=1.0, seed=3, **CHAT)
    assert resp.choices[0].finish_reason == "stop"
    keys = json.loads(resp.choices[0].message.content, object_pairs_hook=lambda pairs: [k for k, _ in pairs])
    assert keys == ["rank", "city"]

def test_response_format_json_object_and_text(client):
    resp = client.chat.completions.create(response_format={"type": "json_object"}, temperature=1.0, seed=4, **CHAT)
    assert isinstance(json.loads(resp.choices[0].message.content), dict)
    resp = client.chat.completions.create(response_format={"type": "text"}, temperature=0, **dict(CHAT, max_tokens=3))
    assert resp.choices[0].finish_reason in ("stop", "length")


def test_vllm_guided_fields(client):
    regex = "[0-9]{3}-[a-z]{2}"
    resp = client.completions.create(model=MODEL, prompt="Code:", max_tokens=20, temperature=1.0, seed=5,
                                     extra_body={"guided_regex": regex})
    assert re.fullmatch(regex, resp.choices[0].text) and resp.choices[0].finish_reason == "stop"
    resp = client.chat.completions.create(temperature=1.0, seed=6, n=3, extra_body={"guided_choice": ["red", "blue"]},
                                          **CHAT)
    assert {c.message.content for c in resp.choices} <= {"red", "blue"}
    resp = client.completions.create(model=MODEL, prompt="P", max_tokens=20, temperature=1.0, seed=7,
                                     extra_body={"guided_grammar": 'root ::= "<" [a-z]+ ">"', "guided_json": None})
    assert re.fullmatch("<[a-z]+>", resp.choices[0].text)
    resp = client.completions.create(model=MODEL, prompt="P", max_tokens=40, temperature=1.0, seed=8,
                                     extra_body={"guided_json": json.dumps(SCHEMA)})
    assert set(json.loads(resp.choices[0].text)) == {"city", "rank"}


STRUCTURE = {"begin": "<f>", "schema": SCHEMA, "end": "</f>"}
XGRAMMAR_TAG = {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "end": "</f>",
                                                     "content": {"type": "json_schema", "json_schema": SCHEMA}}}


def _first_token(server, text: str) -> str:
    resp = httpx.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=60)
    return str(resp.json()["tokens"][0])


@pytest.fixture(scope="module")
def tag_bias(server):
    """logit_bias against whitespace (a structural tag's JSON allows it anywhere, and the random
    model favours it) and for "<", the trigger below."""
    bias = {_first_token(server, c): -100 for c in (" ", "\n", "\r", "\t")}
    return dict(bias, **{_first_token(server, "<"): 30})


def _check(obj):
    assert set(obj) == {"city", "rank"} and re.fullmatch("[a-z]{1,4}", obj["city"])
    assert isinstance(obj["rank"], int) and 1 <= obj["rank"] <= 9


def test_response_format_structural_tag_in_vllms_form(client, submitted_params, tag_bias):
    fmt = {"type": "structural_tag", "structures": [STRUCTURE], "triggers": ["<"]}
    resp = client.chat.completions.create(response_format=fmt, temperature=1.0, seed=9, logit_bias=tag_bias,
                                          **dict(CHAT, max_tokens=50))
    text = resp.choices[0].message.content
    *complete, last = text.split("<f>")[1:]
    assert text.startswith("<f>") and complete and "</f>" not in last
    for segment in complete:
        assert segment.endswith("</f>")
        _check(json.loads(segment[: -len("</f>")]))
    assert submitted_params[-1].guided == GuidedDecoding(structural_tag=fmt)


def test_structural_tag_in_xgrammars_format_on_completions(client, submitted_params, tag_bias):
    """response_format on /v1/completions too (as vLLM takes it), and vLLM's structural_tag field
    as JSON text."""
    for extra in ({"response_format": XGRAMMAR_TAG}, {"structural_tag": json.dumps(XGRAMMAR_TAG)}):
        resp = client.completions.create(model=MODEL, prompt="Tag:", max_tokens=40, temperature=1.0, seed=10,
                                         logit_bias=tag_bias, extra_body=extra)
        body = re.fullmatch("<f>(.*)</f>", resp.choices[0].text, re.S)
        assert resp.choices[0].finish_reason == "stop" and body
        _check(json.loads(body.group(1)))
    assert submitted_params[0].guided == GuidedDecoding(structural_tag=XGRAMMAR_TAG)
    assert submitted_params[1].guided == GuidedDecoding(structural_tag=json.dumps(XGRAMMAR_TAG))
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    resp = client.completions.create(model=MODEL, prompt="P", max_tokens=40, temperature=1.0, seed=8,
                                     extra_body={"response_format": fmt})
    _check(json.loads(resp.choices[0].text))


COMPLETION = dict(model=MODEL, prompt="P", max_tokens=8)


def test_vllm_structured_outputs(client, submitted_params, tag_bias):
    """vLLM's structured_outputs (the guided_* fields' successor): each constraint, its options
    accepted whatever their value, no constraint when it sets none."""
    regex = "[0-9]{3}-[a-z]{2}"
    resp = client.completions.create(model=MODEL, prompt="Code:", max_tokens=20, temperature=1.0, seed=5,
                                     extra_body={"structured_outputs": {"regex": regex, "disable_fallback": True}})
    assert re.fullmatch(regex, resp.choices[0].text) and resp.choices[0].finish_reason == "stop"
    options = {"disable_any_whitespace": False, "disable_additional_properties": True, "whitespace_pattern": None}
    resp = client.chat.completions.create(temperature=1.0, seed=3, **CHAT,
                                          extra_body={"structured_outputs": {"json": SCHEMA, **options}})
    _check(json.loads(resp.choices[0].message.content))
    resp = client.chat.completions.create(temperature=1.0, seed=6, n=3, **CHAT,
                                          extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
    assert {c.message.content for c in resp.choices} <= {"red", "blue"}
    resp = client.completions.create(model=MODEL, prompt="Tag:", max_tokens=40, temperature=1.0, seed=10,
                                     logit_bias=tag_bias,
                                     extra_body={"structured_outputs": {"structural_tag": json.dumps(XGRAMMAR_TAG)}})
    _check(json.loads(re.fullmatch("<f>(.*)</f>", resp.choices[0].text, re.S).group(1)))
    resp = client.completions.create(model=MODEL, prompt="P", max_tokens=3, temperature=0,
                                     extra_body={"structured_outputs": {"json_object": False}})
    assert [p.guided for p in submitted_params] == [
        GuidedDecoding(regex=regex), GuidedDecoding(json=SCHEMA), GuidedDecoding(choice=["red", "blue"]),
        GuidedDecoding(structural_tag=json.dumps(XGRAMMAR_TAG)), None]


@pytest.mark.parametrize("body,param", [
    (dict(CHAT, response_format={"type": "structural_tag", "structures": [STRUCTURE]}), "response_format"),
    (dict(CHAT, response_format={"type": "structural_tag", "structures": [STRUCTURE], "triggers": ["<"],
                                 "schema": {}}), "response_format"),
    (dict(CHAT, response_format={"type": "structural_tag", "structures": [{"begin": "<f>"}], "triggers": ["<"]}),
     "response_format"),
    (dict(CHAT, response_format={"type": "structural_tag", "structures": [STRUCTURE], "triggers": ["["]}),
     "response_format"),
    (dict(COMPLETION, response_format={"type": "yaml"}), "response_format"),
    (dict(COMPLETION, response_format={"type": "json_object"}, guided_json=SCHEMA), "guided_json"),
    (dict(COMPLETION, structural_tag={"format": {"type": "frobnicate"}}), "structural_tag"),
    (dict(COMPLETION, structural_tag="[1]"), "structural_tag"),
    (dict(COMPLETION, structured_outputs={"regex": "a", "choice": ["a"]}), "structured_outputs"),
    (dict(COMPLETION, structured_outputs={"regx": "a"}), "structured_outputs"),
    (dict(COMPLETION, structured_outputs={"regex": "(ab"}), "structured_outputs"),
    (dict(COMPLETION, structured_outputs={"regex": "a", "whitespace_pattern": " "}), "structured_outputs"),
    (dict(COMPLETION, structured_outputs={"regex": "a", "disable_fallback": "yes"}), "structured_outputs"),
    (dict(COMPLETION, structured_outputs={"regex": "a"}, guided_regex="b"), "guided_regex"),
    (dict(CHAT, structured_outputs={"json": "{not json"}), "structured_outputs"),
])
def test_bad_structural_tags_and_structured_outputs_are_400s_naming_the_field(server, body, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    resp = httpx.post(server.url + path, json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.text


@pytest.mark.parametrize("body,param", [
    (dict(CHAT, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}),
     "response_format"),
    (dict(CHAT, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}), "response_format"),
    (dict(CHAT, response_format={"type": "json_schema"}), "response_format"),
    (dict(CHAT, response_format={"type": "json_object", "schema": {}}), "response_format"),
    (dict(CHAT, guided_regex="(ab"), "guided_regex"),
    (dict(CHAT, guided_grammar="root ::= "), "guided_grammar"),
    (dict(CHAT, guided_choice=[]), "guided_choice"),
    (dict(CHAT, guided_json="{not json"), "guided_json"),
    (dict(CHAT, response_format={"type": "json_object"}, guided_regex="a"), "guided_regex"),
    (dict(CHAT, guided_decoding_backend="outlines"), "guided_decoding_backend"),
])
def test_bad_constraints_are_400s_naming_the_field(server, body, param):
    resp = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.text
