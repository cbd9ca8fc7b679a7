"""Stored responses of the Responses API (response_store.py) through the official `openai` client:
`previous_response_id` continues a conversation exactly as the stateless request that sends the
earlier items again (the offline engine's chat answer), retrieve / input_items / delete, `store:
false`, streamed responses, the LRU bounds and the 404s naming the field."""

from __future__ import annotations

import httpx
import pytest

from rlt_runtime import SamplingParams
from rlt_runtime.entrypoints.server.response_store import ResponseStore, input_items_page
from rlt_runtime.entrypoints.server.protocol import ApiError

openai = pytest.importorskip("openai")

MODEL = "ouro-tiny"
GREEDY = dict(model=MODEL, temperature=0, max_output_tokens=6)


def _offline_chat(offline, messages):
    return offline.chat(messages, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0]


def test_previous_response_id_continues_the_conversation(client, offline):
    first = client.responses.create(input="Name one.", instructions="Be brief.", **GREEDY)
    second = client.responses.create(input="Another?", previous_response_id=first.id, **GREEDY)
    third = client.responses.create(input=[{"role": "user", "content": "And?"}], previous_response_id=second.id,
                                    **GREEDY)
    conversation = [{"role": "user", "content": "Name one."}, {"role": "assistant", "content": first.output_text},
                    {"role": "user", "content": "Another?"}]  # instructions are not carried over
    want = _offline_chat(offline, conversation)
    assert second.output_text == want.outputs[0].text and second.usage.input_tokens == len(want.prompt_token_ids)
    assert second.previous_response_id == first.id and second.store is True
    conversation += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "And?"}]
    assert third.output_text == _offline_chat(offline, conversation).outputs[0].text


def test_retrieve_input_items_and_delete(client):
    items = [{"role": "user", "content": c} for c in ("one", "two", "three")]
    resp = client.responses.create(input=items, **GREEDY)
    got = client.responses.retrieve(resp.id)
    assert got.id == resp.id and got.output_text == resp.output_text and got.usage == resp.usage
    page = client.responses.input_items.list(resp.id)
    assert [item.content for item in page.data] == ["three", "two", "one"]  # newest first, as OpenAI lists them
    first = client.responses.input_items.list(resp.id, order="asc", limit=2)
    assert [item.content for item in first.data] == ["one", "two"] and first.has_more
    rest = client.responses.input_items.list(resp.id, order="asc", after=first.data[-1].id)
    assert [item.content for item in rest.data] == ["three"] and not rest.has_more
    client.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.retrieve(resp.id)
    assert caught.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(input="more", previous_response_id=resp.id, **GREEDY)
    assert caught.value.body["param"] == "previous_response_id"
    assert caught.value.body["code"] == "previous_response_not_found"


def test_store_false_and_streamed_responses(client, server):
    kept_out = client.responses.create(input="hi", store=False, **GREEDY)
    assert kept_out.store is False
    assert httpx.get(f"{server.url}/v1/responses/{kept_out.id}").status_code == 404
    events = list(client.responses.create(input="Name one.", stream=True, **GREEDY))
    final = events[-1].response
    assert final.store is True and client.responses.retrieve(final.id).output_text == final.output_text
    follow = client.responses.create(input="Another?", previous_response_id=final.id, stream=True, **GREEDY)
    assert list(follow)[-1].response.previous_response_id == final.id


def test_function_calls_come_back_through_the_store(client):
    pytest.importorskip("xgrammar")
    tools = [{"type": "function", "name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "maxLength": 5}}, "required": ["q"]}}]
    first = client.responses.create(input="Look it up.", tools=tools, tool_choice={"type": "function", "name": "lookup"},
                                    **dict(GREEDY, max_output_tokens=20))
    call = next(item for item in first.output if item.type == "function_call")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "found"}
    stored = client.responses.create(input=[result], previous_response_id=first.id, tools=tools, tool_choice="none",
                                     **GREEDY)
    sent = [{"role": "user", "content": "Look it up."}, call.model_dump(exclude_none=True), result]
    stateless = client.responses.create(input=sent, tools=tools, tool_choice="none", **GREEDY)
    assert stored.output_text == stateless.output_text
    assert stored.usage.input_tokens == stateless.usage.input_tokens


def test_the_store_keeps_the_most_recent(start_server):
    with start_server(responses_store_size=2) as live:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        ids = [client.responses.create(input=f"turn {i}", **GREEDY).id for i in range(3)]
        assert httpx.get(f"{live.url}/v1/responses/{ids[0]}").status_code == 404
        assert all(httpx.get(f"{live.url}/v1/responses/{i}").status_code == 200 for i in ids[1:])
        chained = client.responses.create(input="more", previous_response_id=ids[2], **GREEDY)
        assert chained.previous_response_id == ids[2]  # stored in turn: ids[1] is the least recent, evicted
        with pytest.raises(openai.NotFoundError):
            client.responses.create(input="more", previous_response_id=ids[1], **GREEDY)
        assert client.responses.retrieve(chained.id).id == chained.id
    with start_server(responses_store_size=0) as live:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        resp = client.responses.create(input="hi", **GREEDY)
        assert resp.store is False and httpx.get(f"{live.url}/v1/responses/{resp.id}").status_code == 404


def _response(i: int, previous=None, text="x") -> dict:
    return {"id": f"resp_{i}", "output": [{"id": f"msg_{i}", "type": "message", "content": text}],
            "previous_response_id": previous}


def test_the_store_bounds_count_and_size_and_walks_chains():
    store = ResponseStore(max_responses=3, max_bytes=10_000)
    for i in range(3):
        assert store.put(_response(i, f"resp_{i - 1}" if i else None), [{"id": f"in_{i}"}])
    assert [item["id"] for item in store.conversation("resp_2")] == ["in_0", "msg_0", "in_1", "msg_1", "in_2", "msg_2"]
    for i in (1, 2, 0):  # used in this order: resp_1 is now the least recent
        store.get(f"resp_{i}")
    assert store.put(_response(3), [])
    assert store.get("resp_1") is None and store.get("resp_0") is not None
    assert store.conversation("resp_2") is None  # its chain lost resp_1
    small = ResponseStore(max_responses=10, max_bytes=300)
    assert not small.put(_response(0, text="y" * 400), [])  # larger than the whole store
    assert small.put(_response(1, text="y" * 150), []) and small.put(_response(2, text="y" * 150), [])
    assert small.get("resp_1") is None and small.get("resp_2") is not None  # evicted by size
    assert not ResponseStore(0, 1000).put(_response(5), [])


@pytest.mark.parametrize("kw,param", [(dict(limit=0), "limit"), (dict(limit=101), "limit"), (dict(order="up"), "order"),
                                      (dict(after="nope"), "after")])
def test_input_item_pages_name_bad_parameters(kw, param):
    args = dict(limit=20, order="desc", after=None) | kw
    with pytest.raises(ApiError) as caught:
        input_items_page([{"id": "a"}], **args)
    assert caught.value.param == param
