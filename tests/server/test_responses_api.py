"""OpenAI's Responses API over HTTP with the official `openai` client: the answer is the offline
engine's chat answer to the same conversation (instructions first, text parts, earlier answers),
streamed events build the same response in order, text.format constrains the output, and what the
server does not do is a 400 naming the field."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from rlt_runtime import SamplingParams

openai = pytest.importorskip("openai")

MODEL = "ouro-tiny"
GREEDY = dict(model=MODEL, temperature=0, max_output_tokens=8)


def _offline_chat(offline, messages, max_tokens=8):
    return offline.chat(messages, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)[0]


def test_the_answer_is_the_chat_answer_to_the_conversation(client, offline):
    resp = client.responses.create(input="Why?", instructions="Be brief.", **GREEDY)
    want = _offline_chat(offline, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}])
    out = want.outputs[0]
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.output_text == out.text
    assert [item.type for item in resp.output] == ["message"]
    assert resp.usage.input_tokens == len(want.prompt_token_ids) and resp.usage.output_tokens == len(out.token_ids)
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    finished = out.finish_reason != "length"
    assert resp.status == ("completed" if finished else "incomplete")
    assert (resp.incomplete_details is None) == finished


def test_input_items_with_text_parts_and_an_earlier_answer(client, offline):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Name "}, {"type": "input_text", "text": "one."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Red."}]},
             {"role": "user", "content": "Another?"}]
    resp = client.responses.create(input=items, **GREEDY)
    want = _offline_chat(offline, [{"role": "user", "content": "Name one."}, {"role": "assistant", "content": "Red."},
                                   {"role": "user", "content": "Another?"}])
    assert resp.output_text == want.outputs[0].text and resp.usage.input_tokens == len(want.prompt_token_ids)


def test_an_earlier_responses_output_items_come_back_as_input(client, offline):
    """Stateless multi-turn use sends the previous output back: its reasoning item becomes the
    following assistant message's reasoning_content (which this template does not render)."""
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "thinking"}]}
    answer = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "Red.", "annotations": []}]}
    items = [{"role": "user", "content": "Name one."}, reasoning, answer, {"role": "user", "content": "Another?"}]
    resp = client.responses.create(input=items, **GREEDY)
    want = _offline_chat(offline, [{"role": "user", "content": "Name one."}, {"role": "assistant", "content": "Red."},
                                   {"role": "user", "content": "Another?"}])
    assert resp.output_text == want.outputs[0].text and resp.usage.input_tokens == len(want.prompt_token_ids)
    from rlt_runtime.entrypoints.server.responses import ResponsesRequest

    messages = ResponsesRequest(model=MODEL, input=items, instructions="Be brief.").messages()
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[2] == {"role": "assistant", "content": "Red.", "reasoning_content": "thinking"}
    dropped = ResponsesRequest(model=MODEL, input=[reasoning, {"role": "user", "content": "x"}]).messages()
    assert dropped == [{"role": "user", "content": "x"}]


def test_streamed_events_build_the_same_response_in_order(client):
    whole = client.responses.create(input="Say more.", **dict(GREEDY, max_output_tokens=12))
    events = list(client.responses.create(input="Say more.", stream=True, **dict(GREEDY, max_output_tokens=12)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output_text == whole.output_text and events[-4].text == text
    assert final.usage.output_tokens == whole.usage.output_tokens and final.status == whole.status


def test_text_format_json_schema_constrains_the_output(client):
    pytest.importorskip("xgrammar")
    schema = {"type": "object", "properties": {"rank": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["rank"], "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
    resp = client.responses.create(model=MODEL, input="JSON please.", temperature=1.0, max_output_tokens=30,
                                   text={"format": fmt})
    value = json.loads(resp.output_text)
    assert set(value) == {"rank"} and 1 <= value["rank"] <= 9 and resp.status == "completed"


BASE = {"model": MODEL, "input": "hi", "max_output_tokens": 2}


@pytest.mark.parametrize("body,param,code", [
    (dict(BASE, tools=[{"type": "function", "name": "f", "parameters": {}}]), "tool_choice", "unsupported"),
    (dict(BASE, tools=[{"type": "web_search"}], tool_choice="none"), "tools[0].type", "unsupported"),
    (dict(BASE, tools=[{"type": "function", "name": "a b"}], tool_choice="none"), "tools[0].name", "invalid_value"),
    (dict(BASE, tools=[{"type": "function", "name": "f"}], tool_choice={"type": "function", "name": "g"}),
     "tool_choice", "invalid_value"),
    (dict(BASE, tools=[{"type": "function", "name": "f"}], tool_choice="required",
          text={"format": {"type": "json_object"}}), "tool_choice", "invalid_value"),
    (dict(BASE, conversation="conv_1"), "conversation", "unsupported"),
    (dict(BASE, input=[{"type": "item_reference", "id": "x"}]), "input[0].type", "unsupported"),
    (dict(BASE, input=[{"type": "function_call_output", "output": "1"}]), "input[0].call_id", "invalid_value"),
    (dict(BASE, input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"}]),
     "input[0].arguments", "invalid_value"),
    (dict(BASE, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
     "input[0].content[0].type", "unsupported"),
    (dict(BASE, input=[{"content": "no role"}]), "input[0].role", "invalid_value"),
    (dict(BASE, input=[{"role": "user", "content": "a"}, {"content": "no role"}]), "input[1].role", "invalid_value"),
    (dict(BASE, input=[{"type": "reasoning", "content": [{"type": "summary_text", "text": "s"}]},
                       {"role": "user", "content": "a"}]), "input[0].content", None),
    (dict(BASE, top_logprobs=3), "top_logprobs", "unsupported"),
    (dict(BASE, truncation="auto"), "truncation", "unsupported"),
    (dict(BASE, text={"format": {"type": "yaml"}}), "text", "invalid_value"),
    (dict(BASE, frobnicate=1), "frobnicate", "unknown_field"),
    (dict(BASE, input=[]), "input", None),
])
def test_what_the_server_does_not_do_is_a_400_naming_the_field(server, body, param, code):
    resp = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and err["code"] == code, err


def test_loop_controls_reach_the_engine(client, submitted_params):
    client.responses.create(input="hi", **GREEDY, extra_body={"min_loops": 1, "max_loops": 2, "exit_threshold": 0.5,
                                                             "speculative": False, "priority": 3, "seed": 7})
    p = submitted_params[-1]
    assert (p.min_loops, p.max_loops, p.exit_threshold, p.speculative, p.priority, p.seed) == (1, 2, 0.5, False, 3, 7)
    client.responses.create(input="hi", **GREEDY)
    p = submitted_params[-1]
    assert (p.min_loops, p.max_loops, p.exit_threshold, p.speculative, p.priority) == (None, None, 1.0, True, 0)


def test_fields_without_effect_are_accepted(server):
    body = dict(BASE, store=True, metadata={"k": "v"}, user="u", reasoning={"effort": "low"}, include=[],
                tool_choice="none", parallel_tool_calls=True, truncation="disabled")
    resp = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert re.fullmatch("resp_[0-9a-f]+", resp.json()["id"])
