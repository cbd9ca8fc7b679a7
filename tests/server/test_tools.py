"""Function tools on chat completions with the official `openai` client: a named tool_choice answers
with that function's call, its arguments following the function's schema; "required" with one or
more calls of the given functions; "auto" with the calls the model writes, read by the hermes
parser (the model's text forced by guided_regex), the text before them the content; all streamed as
OpenAI streams tool calls (the accumulated deltas equal the whole answer); tools, earlier tool calls
and tool results reach the chat template; "auto" without a parser and malformed tools, choices and
tool messages are 400s naming the field; `LLM.chat(tools=...)`; the parser on its own."""

from __future__ import annotations

import json
import re

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("xgrammar")

from rlt_runtime import GuidedDecoding  # noqa: E402
from rlt_runtime.entrypoints.server.tools import held_back, split_calls  # noqa: E402

MODEL = "ouro-tiny"

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,5}$"},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
CLOCK = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "cet"]}},
         "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Forecast for a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": CLOCK}}]


def _check_arguments(name: str, arguments: str) -> None:
    """The arguments JSON of a call of `name` follows that function's schema (WEATHER or CLOCK)."""
    args = json.loads(arguments)
    if name == "get_weather":
        assert set(args) == {"city", "days"} and re.fullmatch("[a-z]{1,5}", args["city"]), args
        assert isinstance(args["days"], int) and 1 <= args["days"] <= 7, args
    else:
        assert name == "get_time" and args in ({"zone": "utc"}, {"zone": "cet"}), (name, args)

# A template that writes tool definitions, earlier calls and tool results (as Hermes-style templates do).
TOOL_TEMPLATE = (
    "{%- if tools -%}{{ '<|im_start|>system\\nTools: ' }}{%- for t in tools -%}{{ t['function']['name'] + ' ' }}"
    "{%- endfor -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
    "{%- for c in m.get('tool_calls', []) -%}{{ '<tool_call>' + c['function']['name'] + ':' + "
    "c['function']['arguments']['city'] + '</tool_call>' }}{%- endfor -%}"
    "{%- if m['role'] == 'tool' -%}{{ '#' + m['tool_call_id'] }}{%- endif -%}{{ '<|im_end|>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
ASK = [{"role": "user", "content": "Weather in Oslo for 3 days?"}]
CHAT = dict(model=MODEL, messages=ASK, max_tokens=60, temperature=1.0, seed=5)


@pytest.fixture(scope="module")
def server(start_server):
    with start_server(engine_options={"max_model_len": 512}, chat_template=TOOL_TEMPLATE) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def auto_client(start_server):
    """A client of a server started with the hermes tool-call parser (tool_choice "auto")."""
    with start_server(engine_options={"max_model_len": 512}, chat_template=TOOL_TEMPLATE,
                      tool_call_parser="hermes") as live:
        yield openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def test_named_tool_choice_answers_with_that_call(client, submitted_params):
    resp = client.chat.completions.create(tools=TOOLS, tool_choice=_named("get_weather"), **CHAT)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"  # vLLM's reason for a named function's call
    assert choice.message.content == "" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("chatcmpl-tool-")
    _check_arguments("get_weather", call.function.arguments)
    assert submitted_params[-1].guided == GuidedDecoding(json=WEATHER)


def test_required_tool_choice_answers_with_calls_of_the_given_functions(client, submitted_params):
    resp = client.chat.completions.create(tools=TOOLS, tool_choice="required", **dict(CHAT, max_tokens=120))
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == ""
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        _check_arguments(call.function.name, call.function.arguments)
    assert len({c.id for c in choice.message.tool_calls}) == len(choice.message.tool_calls)
    schema = submitted_params[-1].guided.json
    assert schema["type"] == "array" and schema["minItems"] == 1 and len(schema["items"]["anyOf"]) == 2


def test_parallel_tool_calls_false_makes_one_required_call(client, submitted_params):
    resp = client.chat.completions.create(tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                          **dict(CHAT, max_tokens=120))
    assert len(resp.choices[0].message.tool_calls) == 1 and resp.choices[0].finish_reason == "tool_calls"
    assert submitted_params[-1].guided.json["maxItems"] == 1


@pytest.mark.parametrize("tool_choice,max_tokens", [(_named("get_time"), 40), ("required", 120)])
def test_streamed_tool_calls_add_up_to_the_whole_answer(client, tool_choice, max_tokens):
    kw = dict(CHAT, tools=TOOLS, tool_choice=tool_choice, max_tokens=max_tokens)
    whole = client.chat.completions.create(**kw).choices[0]
    calls, finish, pieces = {}, None, 0
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            assert ch.delta.content in (None, "")
            for d in ch.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    assert call["id"] is None  # an id comes once, with the call's first delta
                    call["id"], call["name"] = d.id, d.function.name
                call["arguments"] += d.function.arguments or ""
                pieces += bool(d.function.arguments)
            finish = ch.finish_reason or finish
    if tool_choice != "required":
        assert pieces > 3  # a named function's arguments stream as they are written
    assert finish == whole.finish_reason
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert all(c["id"] for c in calls.values())


def test_tools_earlier_calls_and_results_reach_the_template(client, server):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    resp = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none",
                                          max_tokens=2, extra_body={"return_token_ids": True})
    prompt = httpx.post(server.url + "/detokenize", json={"tokens": resp.prompt_token_ids}).json()["prompt"]
    assert prompt == ("<|im_start|>system\nTools: get_weather get_time <|im_end|>\n"
                      "<|im_start|>user\nWeather in Oslo for 3 days?<|im_end|>\n"
                      "<|im_start|>assistant\n<tool_call>get_weather:oslo</tool_call><|im_end|>\n"
                      "<|im_start|>tool\nsunny#call_1<|im_end|>\n<|im_start|>assistant\n")
    assert resp.choices[0].message.tool_calls == []  # "none": a text answer
    tokens = httpx.post(server.url + "/tokenize", json={"messages": history, "tools": TOOLS}).json()["tokens"]
    assert tokens == resp.prompt_token_ids  # /tokenize renders tools as chat completions do
    bad = httpx.post(server.url + "/tokenize", json={"messages": history, "tools": [{"type": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools[0].type"


@pytest.mark.parametrize("body,param", [
    ({"tools": TOOLS}, "tool_choice"),  # "auto", the default with tools: no free-form tool-call parser
    ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": _named("get_news")}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}], "tool_choice": "required"}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}], "tool_choice": "none"},
     "tools[0].function.name"),
    ({"tools": [TOOLS[0], TOOLS[0]], "tool_choice": "none"}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}], "tool_choice": "none"},
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"functions": [{"name": "f"}]}, "functions"),
])
def test_bad_tools_and_choices_are_400s_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"model": MODEL, "messages": ASK, "max_tokens": 4, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_offline_chat_renders_tools():
    from rlt_runtime import LLM, SamplingParams

    llm = LLM(MODEL, dtype="float32", device="cpu", max_num_seqs=1, num_blocks=64, max_model_len=128)
    out = llm.chat(ASK, SamplingParams(max_tokens=1), chat_template=TOOL_TEMPLATE, tools=TOOLS, use_tqdm=False)
    assert out[0].prompt.startswith("<|im_start|>system\nTools: get_weather get_time <|im_end|>\n")


def _stream(client, **kw) -> tuple[str, list, str]:
    """(content, [(name, arguments)], finish reason) of a streamed answer, its deltas added up."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                call = calls.setdefault(d.index, ["", ""])
                call[0] += d.function.name or ""
                call[1] += d.function.arguments or ""
            finish = ch.finish_reason or finish
    return content, [tuple(c) for _, c in sorted(calls.items())], finish


# Written as a Hermes-style model writes its calls; the regex leaves the text before them and the
# arguments' values to the model.
HERMES = (r'[a-z ]{0,12}<tool_call>\{"name": "get_time", "arguments": \{"zone": "(utc|cet)"\}\}</tool_call>'
          r'(<tool_call>\{"name": "get_weather", "arguments": \{"city": "[a-z]{1,3}", "days": [1-7]\}\}</tool_call>)?')


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_auto_tool_choice_reads_the_calls_the_model_writes(auto_client, seed):
    kw = dict(CHAT, tools=TOOLS, seed=seed, max_tokens=200, extra_body={"guided_regex": HERMES})
    choice = auto_client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls"
    names = [c.function.name for c in choice.message.tool_calls]
    assert names in (["get_time"], ["get_time", "get_weather"])
    for call in choice.message.tool_calls:
        _check_arguments(call.function.name, call.function.arguments)
    assert re.fullmatch("[a-z ]{0,12}", choice.message.content)  # the text before the first call
    content, calls, finish = _stream(auto_client, **kw)
    assert (content, calls, finish) == (choice.message.content, [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls], "tool_calls")


def test_auto_answer_without_calls_is_text(auto_client):
    kw = dict(CHAT, tools=TOOLS, max_tokens=12, extra_body={"guided_regex": "[a-z<]{3,8}"})
    choice = auto_client.chat.completions.create(**kw).choices[0]
    assert choice.message.tool_calls == [] and choice.finish_reason == "stop"
    assert _stream(auto_client, **kw) == (choice.message.content, [], "stop")


@pytest.mark.parametrize("text,content,calls", [
    ("plain", "plain", None),
    ('hi <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', "hi ", [("f", '{"a": 1}')]),
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": "g", "arguments": "{\\"b\\": 2}"}',
     "", [("f", "{}"), ("g", '{"b": 2}')]),  # the last call unterminated; arguments given as a JSON string
    ('<tool_call>{"name": "f", "argu', '<tool_call>{"name": "f", "argu', None),  # cut short: stays text
    ('<tool_call>["f"]</tool_call>', '<tool_call>["f"]</tool_call>', None),
    ('<tool_call>{"name": 3}</tool_call>', '<tool_call>{"name": 3}</tool_call>', None),
])
def test_hermes_parser(text, content, calls):
    got_content, got = split_calls("auto", text)
    assert got_content == content
    assert (None if got is None else [(c["function"]["name"], c["function"]["arguments"]) for c in got]) == calls


def test_streamed_content_holds_back_a_possible_marker():
    assert [held_back(t) for t in ("abc", "abc<", "abc<tool", "abc<tool_call", "<t>", "x<tool_c")] == [0, 1, 5, 10, 0, 7]


def test_tool_call_parser_option_is_checked(capsys):
    from rlt_runtime.entrypoints.server import cli as serve_cli
    from rlt_runtime.entrypoints.server.app import ServerConfig
    from rlt_runtime.errors import ConfigError

    with pytest.raises(ConfigError, match="tool_call_parser must be None or one of 'hermes'"):
        ServerConfig(tool_call_parser="llama3_json").validate()
    assert serve_cli.main(["--model", "ouro-tiny", "--enable-auto-tool-choice"]) == 2  # before the port opens
    assert "--enable-auto-tool-choice needs --tool-call-parser (one of hermes)" in capsys.readouterr().err
    args = serve_cli.parse_args(["ouro-tiny", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    assert args.tool_call_parser == "hermes"


# ---- the Responses API: the same tools, in its flat form ----------------------------------------

FLAT = [{"type": "function", **t["function"]} for t in TOOLS]
RESP = dict(model=MODEL, input="Weather in Oslo for 3 days?", temperature=1.0, extra_body={"seed": 5})


def test_responses_named_function_call(client, submitted_params):
    resp = client.responses.create(tools=FLAT, tool_choice={"type": "function", "name": "get_weather"},
                                   max_output_tokens=60, **RESP)
    assert resp.status == "completed" and [item.type for item in resp.output] == ["function_call"]
    call = resp.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("chatcmpl-tool-") and call.id.startswith("fc_")
    _check_arguments("get_weather", call.arguments)
    assert submitted_params[-1].guided == GuidedDecoding(json=WEATHER, origin="tool_choice")
    assert resp.tool_choice.name == "get_weather" and [t.name for t in resp.tools] == ["get_weather", "get_time"]


def test_responses_named_call_streams_its_arguments(client):
    kw = dict(tools=FLAT, tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60, **RESP)
    whole = client.responses.create(**kw).output
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert kinds == (["response.created", "response.in_progress", "response.output_item.added"]
                     + ["response.function_call_arguments.delta"] * len(deltas)
                     + ["response.function_call_arguments.done", "response.output_item.done", "response.completed"])
    assert len(deltas) > 3 and "".join(e.delta for e in deltas) == whole[0].arguments
    added, done, final = events[2].item, events[-2].item, events[-1].response.output
    assert added.id == done.id == final[0].id == deltas[0].item_id and added.call_id == final[0].call_id
    assert added.arguments == "" and added.status == "in_progress" and done.arguments == whole[0].arguments
    assert [(i.type, i.name) for i in final] == [("function_call", "get_weather")]


def test_responses_required_calls_stream_as_openai_streams_them(client):
    kw = dict(tools=FLAT, tool_choice="required", max_output_tokens=120, **RESP)
    whole = client.responses.create(**kw)
    assert whole.output and all(item.type == "function_call" for item in whole.output)
    for item in whole.output:
        _check_arguments(item.name, item.arguments)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    per_call = ["response.output_item.added", "response.function_call_arguments.delta",
                "response.function_call_arguments.done", "response.output_item.done"]
    assert kinds[2:-1] == per_call * len(whole.output)
    final = events[-1].response.output
    assert [(i.name, i.arguments) for i in final] == [(i.name, i.arguments) for i in whole.output]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [(e.item_id, e.arguments) for e in done] == [(i.id, i.arguments) for i in final]


def test_responses_function_calls_and_outputs_come_back_as_input(client, server, monkeypatch):
    prompts = []
    submit = server.worker.submit
    monkeypatch.setattr(server.worker, "submit", lambda p, *a: prompts.append(p[0]["prompt"]) or submit(p, *a))
    history = [{"role": "user", "content": "Weather in Oslo for 3 days?"},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "oslo"}'},
               {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
    resp = client.responses.create(model=MODEL, input=history, tools=FLAT, tool_choice="none", max_output_tokens=2)
    assert [item.type for item in resp.output] == ["message"]
    assert prompts[-1] == ("<|im_start|>system\nTools: get_weather get_time <|im_end|>\n"
                           "<|im_start|>user\nWeather in Oslo for 3 days?<|im_end|>\n"
                           "<|im_start|>assistant\n<tool_call>get_weather:oslo</tool_call><|im_end|>\n"
                           "<|im_start|>tool\nsunny#call_1<|im_end|>\n<|im_start|>assistant\n")


def test_responses_auto_needs_the_parser_and_answers_text_without_calls(client, auto_client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(tools=FLAT, max_output_tokens=4, **RESP)
    assert err.value.body["param"] == "tool_choice"
    resp = auto_client.responses.create(tools=FLAT, max_output_tokens=4, **RESP)
    assert [item.type for item in resp.output] == ["message"] and resp.tool_choice == "auto"
