"""Function tools on chat completions with the official `openai` client: a named tool_choice answers
with that function's call, its arguments following the function's schema; "required" with one or
more calls of the given functions; "auto" with the calls the model writes, read by the hermes,
llama3_json, pythonic or mistral parser (the model's text forced by guided_regex), the text before
them the content; all streamed as OpenAI streams tool calls (the accumulated deltas equal the whole
answer, no call text streamed as content); tools, earlier tool calls and tool results reach the chat
template; "auto" without a parser, an unknown parser and malformed tools, choices and tool messages
are errors naming the field; `LLM.chat(tools=...)`; the parsers on their own (unsafe pythonic calls
stay text)."""

from __future__ import annotations

import dataclasses
import json
import re

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("xgrammar")

from rlt_runtime import GuidedDecoding  # noqa: E402
from rlt_runtime.entrypoints.server.tools import PARSERS, RequiredCalls, held_back, split_calls  # noqa: E402

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
    assert pieces > 3  # the arguments stream as they are written (a "required" answer's too)
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


# What a model of each other format writes: two calls (the regex leaves their values to the model),
# and the pattern of the content before them.
WRITTEN = {
    "llama3_json": (r'(<\|python_tag\|>)?\{"name": "get_time", "parameters": \{"zone": "(utc|cet)"\}\}; '
                    r'\{"name": "get_weather", "parameters": \{"city": "[a-z]{1,3}", "days": [1-7]\}\}', ""),
    "pythonic": (r'\[get_time\(zone="(utc|cet)"\), get_weather\(city="[a-z]{1,3}", days=[1-7]\)\]', ""),
    "mistral": (r'[a-z]{3,8} \[TOOL_CALLS\]\[\{"name": "get_time", "arguments": \{"zone": "(utc|cet)"\}\}, '
                r'\{"name": "get_weather", "arguments": \{"city": "[a-z]{1,3}", "days": [1-7]\}\}\]', "[a-z]{3,8} "),
}
# Answers that begin as a call of that format could, but are no calls: they stay content.
NOT_CALLS = {"llama3_json": r'\{"city": "[a-z]{2,5}"\}', "pythonic": r"\[[a-z]{2,5}\(\)\] and [a-z]{2,5}",
             "mistral": r"[a-z]{2,5} \[TOOL_CALLS\] [a-z]{2,5}"}


@pytest.fixture(scope="module", params=sorted(WRITTEN))
def parser_server(request, start_server):
    """(parser, live server started with it, client of that server) for each parser but hermes."""
    with start_server(engine_options={"max_model_len": 512}, chat_template=TOOL_TEMPLATE,
                      tool_call_parser=request.param) as live:
        yield request.param, live, openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0,
                                                 timeout=120)


def _chunks(client, **kw) -> list[tuple[str, list, str]]:
    """(content, [(name, arguments)], finish reason) of each streamed choice delta."""
    return [(ch.delta.content or "", [(d.function.name, d.function.arguments) for d in ch.delta.tool_calls or []],
             ch.finish_reason) for chunk in client.chat.completions.create(stream=True, **kw) for ch in chunk.choices]


def test_auto_tool_choice_reads_each_parsers_format(parser_server):
    parser, _, client = parser_server
    regex, content = WRITTEN[parser]
    kw = dict(CHAT, tools=TOOLS, max_tokens=200, extra_body={"guided_regex": regex})
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls" and re.fullmatch(content, choice.message.content)
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert [name for name, _ in calls] == ["get_time", "get_weather"]
    for name, arguments in calls:
        _check_arguments(name, arguments)
    chunks = _chunks(client, **kw)
    assert "".join(piece for piece, _, _ in chunks) == choice.message.content  # no call text streamed as content
    assert chunks[-1][0] == ""  # the content streamed before the answer ended
    assert [(got, finish) for _, got, finish in chunks if got or finish] == [(calls, "tool_calls")]  # in the last delta


@pytest.mark.parametrize("like_a_call", [True, False])
def test_auto_text_answers_of_each_parser_stay_content(parser_server, like_a_call):
    parser, _, client = parser_server
    regex = NOT_CALLS[parser] if like_a_call else "[a-z]{4} [a-z ]{6,12}"
    kw = dict(CHAT, tools=TOOLS, max_tokens=60, extra_body={"guided_regex": regex})
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.message.tool_calls == [] and choice.finish_reason == "stop"
    assert re.fullmatch(regex, choice.message.content)
    chunks = _chunks(client, **kw)
    assert "".join(piece for piece, _, _ in chunks) == choice.message.content
    assert not any(got for _, got, _ in chunks) and chunks[-1][2] == "stop"
    if not like_a_call:  # text that cannot begin a call streams as it comes
        assert "".join(piece for piece, _, finish in chunks if finish is None)


def _parsed(parser: str, text: str) -> tuple[str, list]:
    """(content, [(name, arguments)] or None) of an "auto" answer `text` read by `parser`."""
    content, calls = split_calls("auto", text, PARSERS[parser])
    return content, None if calls is None else [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


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
    assert _parsed("hermes", text) == (content, calls)


def test_streamed_content_holds_back_a_possible_marker():
    texts = ("abc", "abc<", "abc<tool", "abc<tool_call", "<t>", "x<tool_c")
    assert [held_back(t, "<tool_call>") for t in texts] == [0, 1, 5, 10, 0, 7]
    assert [held_back(t, "[TOOL_CALLS]") for t in ("a [", "a [TOOL_CALLS", "a [b", "[TOOL]")] == [1, 11, 0, 0]


@pytest.mark.parametrize("text,calls", [
    ('{"name": "f", "parameters": {"a": 1}}', [("f", '{"a": 1}')]),
    ('<|python_tag|>{"name": "f", "parameters": {"a": "x; y"}}; {"name": "g", "arguments": {}}',
     [("f", '{"a": "x; y"}'), ("g", "{}")]),  # a ';' inside a string is no separator
    ('\n {"name": "f", "arguments": "{\\"b\\": 2}"};{"name": "g", "parameters": {}};\n'
     '{"name": "h", "parameters": {}}\n',
     [("f", '{"b": 2}'), ("g", "{}"), ("h", "{}")]),
    ('Sure: {"name": "f", "parameters": {}}', None),  # text first: plain content
    ('{"name": "f", "parameters": {"a": ', None),  # cut short
    ('{"name": "f", "parameters": {}} {"name": "g", "parameters": {}}', None),  # no ';' between them
    ('{"name": "f", "parameters": {}} and more', None),
    ('{"city": "oslo"}', None),  # JSON, but no call
    ('{"name": "f"}', None),  # neither parameters nor arguments
    ('<|python_tag|>print("hi")', None),
    ('[{"name": "f", "parameters": {}}]', None),
])
def test_llama3_json_parser(text, calls):
    assert _parsed("llama3_json", text) == ("" if calls else text, calls)


@pytest.mark.parametrize("text,calls", [
    ('[get_weather(city="Paris", days=3), get_time(zone=\'utc\')]',
     [("get_weather", '{"city": "Paris", "days": 3}'), ("get_time", '{"zone": "utc"}')]),
    (' [\n  f(),\n  g(a=-1.5, b=[True, None], c={"k": "v"}, d=-2),\n]\n',
     [("f", "{}"), ("g", '{"a": -1.5, "b": [true, null], "c": {"k": "v"}, "d": -2}')]),
    ("The answer: [f()]", None),  # text first: plain content
    ("[f(a=1), g(b=", None),  # cut short
    ("[]", None),
    ("[1, 2]", None),
    ("[f()] + [g()]", None),
    ("[f()][0]", None),
    ("[f()]\n[g()]", None),
])
def test_pythonic_parser(text, calls):
    assert _parsed("pythonic", text) == ("" if calls else text, calls)


@pytest.mark.parametrize("text", [
    '[os.system("rm -rf /")]',
    '[os.system(command="rm -rf /")]',  # an attribute call
    '[f(x=__import__("os"))]',
    '[f(x=__import__("os").system("touch pwned"))]',
    "[f(x=os.environ)]",
    "[f(x=y)]",  # a name
    "[f(x=g())]",
    '[f("x")]',  # positional arguments
    "[f(**kwargs)]",
    "[f(x=1 + 2)]",
    "[f(x=(1, 2))]",
    "[f(x={1, 2})]",
    "[f(x={1: 2})]",
    "[f(x={**d})]",
    "[f(x=lambda: 0)]",
    "[f(x=b'x')]",
    "[f(x=1j)]",
    "[f(x=1e999)]",
    "[f(x=-True)]",
    "[f(a=1, a=2)]",
    "[f(x=" + "-" * 100000 + "1)]",  # nested too deeply for the parser
])
def test_pythonic_parser_reads_only_literals(text):
    assert _parsed("pythonic", text) == (text, None)


@pytest.mark.parametrize("text,content,calls", [
    ('[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": "{\\"b\\": 2}"}]',
     "", [("f", '{"a": 1}'), ("g", '{"b": 2}')]),
    ('Let me look.[TOOL_CALLS] [{"name": "f"}]\n', "Let me look.", [("f", "{}")]),
    ('plain [TOOL', 'plain [TOOL', None),
    ('ok [TOOL_CALLS][{"name": "f", "argu', 'ok [TOOL_CALLS][{"name": "f", "argu', None),  # cut short
    ("[TOOL_CALLS][]", "[TOOL_CALLS][]", None),
    ('[TOOL_CALLS]{"name": "f", "arguments": {}}', '[TOOL_CALLS]{"name": "f", "arguments": {}}', None),
    ('[TOOL_CALLS][{"name": "f"}] trailing', '[TOOL_CALLS][{"name": "f"}] trailing', None),
])
def test_mistral_parser(text, content, calls):
    assert _parsed("mistral", text) == (content, calls)
    if calls:  # Mistral's chat templates take back only ids of 9 letters or digits
        ids = [c["id"] for c in split_calls("auto", text, PARSERS["mistral"])[1]]
        assert all(re.fullmatch("[A-Za-z0-9]{9}", i) for i in ids) and len(set(ids)) == len(ids)


@pytest.mark.parametrize("parser,text,ready", [
    ("hermes", "abc<tool", 3), ("hermes", 'hi <tool_call>{"na', 3), ("hermes", "a < b", 5),
    ("mistral", "ok [TOOL", 3), ("mistral", "ok [TOOL_CALLS][{", 3), ("mistral", "a [b", 4),
    ("llama3_json", "", 0), ("llama3_json", " \n", 0), ("llama3_json", "<|pyth", 0), ("llama3_json", '{"na', 0),
    ("llama3_json", " <|python_tag|>print(", 0), ("llama3_json", "Hello", 5), ("llama3_json", " <a", 3),
    ("llama3_json", "[1", 2),
    ("pythonic", "", 0), ("pythonic", " [", 0), ("pythonic", "[get_w", 0), ("pythonic", "[\n  f", 0),
    ("pythonic", "[1, 2]", 6), ("pythonic", "Hi [f()]", 8), ("pythonic", "{", 1),
])
def test_parsers_stream_what_cannot_be_part_of_a_call(parser, text, ready):
    assert PARSERS[parser].streamable(text) == ready


def test_tool_call_parser_option_is_checked(capsys):
    from rlt_runtime.entrypoints.server import cli as serve_cli
    from rlt_runtime.entrypoints.server.app import ServerConfig
    from rlt_runtime.errors import ConfigError

    with pytest.raises(ConfigError, match="tool_call_parser must be None or one of 'hermes', 'llama3_json', "
                       "'mistral', 'pythonic', got 'llama3'"):
        ServerConfig(tool_call_parser="llama3").validate()
    assert serve_cli.main(["--model", "ouro-tiny", "--enable-auto-tool-choice"]) == 2  # before the port opens
    assert ("--enable-auto-tool-choice needs --tool-call-parser (one of hermes, llama3_json, mistral, pythonic)"
            in capsys.readouterr().err)
    for name in ("hermes", "llama3_json", "mistral", "pythonic"):
        args = serve_cli.parse_args(["ouro-tiny", "--enable-auto-tool-choice", "--tool-call-parser", name])
        assert args.tool_call_parser == name
        ServerConfig(tool_call_parser=name).validate()
    with pytest.raises(SystemExit) as exit_:
        serve_cli.main(["--model", "ouro-tiny", "--tool-call-parser", "llama3"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --tool-call-parser: invalid choice: 'llama3'" in err
    assert all(name in err.split("invalid choice")[1] for name in ("hermes", "llama3_json", "mistral", "pythonic"))


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
    added, delta, args_done, item_done = ("response.output_item.added", "response.function_call_arguments.delta",
                                          "response.function_call_arguments.done", "response.output_item.done")
    calls = "".join({added: "(", delta: "+", args_done: ")", item_done: "."}[k] for k in kinds[2:-1])
    assert re.fullmatch(r"(\(\++\)\.)+", calls) and calls.count("(") == len(whole.output), calls
    assert calls.count("+") > 2 * len(whole.output)  # the arguments grow as they are written
    grown = [e for e in events if e.type == delta]
    assert "".join(e.delta for e in grown if e.item_id == events[2].item.id) == whole.output[0].arguments
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


def test_responses_auto_reads_each_parsers_format(parser_server, monkeypatch):
    parser, live, client = parser_server
    regex, content = WRITTEN[parser]
    submit = live.worker.submit
    monkeypatch.setattr(live.worker, "submit", lambda prompts, params, *a: submit(
        prompts, dataclasses.replace(params, guided=GuidedDecoding(regex=regex)), *a))
    kw = dict(tools=FLAT, max_output_tokens=200, **RESP)
    output = client.responses.create(**kw).output
    calls = [(item.name, item.arguments) for item in output if item.type == "function_call"]
    assert [name for name, _ in calls] == ["get_time", "get_weather"]
    texts = [item.content[0].text for item in output if item.type == "message"]
    assert [re.fullmatch(content, text) is not None for text in texts] == ([True] if content else [])
    events = list(client.responses.create(stream=True, **kw))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "".join(texts)
    final = events[-1].response.output
    assert [(item.name, item.arguments) for item in final if item.type == "function_call"] == calls


REQUIRED_TEXT = ('[{"name": "get_weather", "parameters": {"city": "o\\"sl}o", "days": [1, {"a": 2}]}}, '
                 '{"name": "f", "parameters": 12}, {"name": "g", "parameters": "x,}y"}]')


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(REQUIRED_TEXT)])
def test_required_calls_stream_their_arguments_as_written(step):
    """However the answer arrives, each call's id and name come once, before its arguments, and the
    arguments add up to the parameters' text as written (braces and quotes inside strings included)."""
    reader, calls = RequiredCalls(), {}
    for i in range(0, len(REQUIRED_TEXT), step):
        for d in reader.feed(REQUIRED_TEXT[i:i + step]):
            call = calls.setdefault(d["index"], {"name": None, "arguments": ""})
            if "id" in d:
                assert call["name"] is None and d["function"]["arguments"] == ""
                call["name"] = d["function"]["name"]
            else:
                assert call["name"] is not None
            call["arguments"] += d["function"]["arguments"]
    want = [("get_weather", '{"city": "o\\"sl}o", "days": [1, {"a": 2}]}'), ("f", "12"), ("g", '"x,}y"')]
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == want
    _, whole = split_calls("required", REQUIRED_TEXT)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in whole] == want


def test_required_answers_cut_short_keep_what_was_written():
    cut = REQUIRED_TEXT[:60]
    content, calls = split_calls("required", cut)
    assert content == "" and [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("get_weather", '{"city": "o\\"sl}o", "')]
    assert split_calls("required", '[{"name": "get_w') == ('[{"name": "get_w', None)  # no call begun: text
