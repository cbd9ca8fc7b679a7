"""Function tools on chat completions: `tools`, `tool_choice` and the answer's `tool_calls`.

The tools go to the chat template (transformers renders them as the checkpoint's template writes
tool definitions). A named `tool_choice` (`{"type": "function", "function": {"name": ...}}`) makes
the answer that function's arguments: JSON following its `parameters` schema, enforced by the same
structured-output machinery as `response_format`. `"required"` makes it a JSON array of one or more
`{"name": ..., "parameters": {...}}` calls, each following its function's schema (vLLM's form);
`parallel_tool_calls: false` limits that array to one call; `RequiredCalls` reads it as it grows,
so each call's arguments stream as they are written. `"none"` answers in text. `"auto"` (the
default when tools are given) lets the model answer freely and parses the calls it writes, which
needs a parser of the model's format (`--tool-call-parser`; without one, "auto" is a 400 naming
tool_choice, as vLLM answers without `--enable-auto-tool-choice`). Parsers (vLLM's names):

* ``hermes``: calls written as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes,
  Qwen and the templates that follow them); the text before the first call is the content.
* ``llama3_json``: the answer is one or more ``{"name": ..., "parameters": {...}}`` objects
  (``"arguments"`` is read too), separated by ``;``, optionally after ``<|python_tag|>`` (Llama 3.1
  to 3.3). An answer that does not start with one is content.
* ``pythonic``: the answer is a Python list of calls, ``[get_weather(city="Paris"), f()]`` (Llama
  3.2 and 4), read with `ast` and never evaluated: keyword arguments only, their values literals
  (strings, numbers, booleans, None, lists, dicts). Anything else is content.
* ``mistral``: ``[TOOL_CALLS]`` then a JSON array of ``{"name": ..., "arguments": {...}}`` (Mistral);
  the text before the marker is the content. Its calls' ids are 9 letters or digits, as Mistral's
  chat templates require when the calls come back.

An answer whose calls do not parse (cut short by a length limit) stays text, with no calls. Streamed,
an answer's content goes out as soon as it cannot be part of a call: the text before a marker (the
start of a possible marker held back), or for llama3_json and pythonic the whole answer once its
first characters cannot begin a call.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
import uuid
from abc import ABC, abstractmethod
from typing import Any, Optional

from .protocol import ApiError

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ALPHANUMERIC = string.ascii_letters + string.digits
FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
ANY_OBJECT = {"type": "object"}


def check_tools(tools: Optional[list]) -> list[dict]:
    """The function definitions of `tools` ([{"type": "function", "function": {...}}]); 400s name the field."""
    functions = []
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ApiError(400, f"{where}.type must be 'function' (the only tool type this server has)",
                           f"{where}.type", "unsupported")
        extra = sorted(set(tool) - {"type", "function"})
        fn = tool.get("function")
        if extra or not isinstance(fn, dict):
            raise ApiError(400, f"{where} must be {{'type': 'function', 'function': {{...}}}}", where, "invalid_value")
        unknown = sorted(set(fn) - FUNCTION_KEYS)
        if unknown:
            raise ApiError(400, f"{where}.function has unknown keys {unknown} (allowed: {sorted(FUNCTION_KEYS)})",
                           f"{where}.function", "invalid_value")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ApiError(400, f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {name!r}",
                           f"{where}.function.name", "invalid_value")
        if name in (f["name"] for f in functions):
            raise ApiError(400, f"{where}.function.name {name!r} is given twice", f"{where}.function.name",
                           "invalid_value")
        if not isinstance(fn.get("parameters", {}), dict):
            raise ApiError(400, f"{where}.function.parameters must be a JSON schema object",
                           f"{where}.function.parameters", "invalid_value")
        if not isinstance(fn.get("description", ""), str):
            raise ApiError(400, f"{where}.function.description must be a string", f"{where}.function.description",
                           "invalid_value")
        functions.append(fn)
    return functions


def resolve_choice(tool_choice: Any, functions: list[dict], parser: Optional[str] = None) -> Optional[str]:
    """What `tool_choice` asks for: None (answer in text), "required", "auto" (free-form calls read
    by `parser`) or the name of the function the answer must call. 400s name tool_choice."""
    if tool_choice in (None, "none") or not functions and tool_choice == "auto":
        if tool_choice is None and functions:
            tool_choice = "auto"  # OpenAI's default with tools
        else:
            return None
    if not functions:
        raise ApiError(400, f"tool_choice {tool_choice!r} needs tools", "tool_choice", "invalid_value")
    if tool_choice == "required":
        return "required"
    if tool_choice == "auto":
        if parser is not None:
            return "auto"
        raise ApiError(400, "tool_choice 'auto' (the default when tools are given) needs a parser of the model's "
                       "free-form tool calls, and this server was started without one (rlt-serve "
                       f"--tool-call-parser {{{','.join(TOOL_CALL_PARSERS)}}}); send tool_choice 'required', "
                       "{'type': 'function', 'function': {'name': ...}} or 'none'", "tool_choice", "unsupported")
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or not isinstance(name, str):
        raise ApiError(400, "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': "
                       f"{{'name': ...}}}}, got {tool_choice!r}", "tool_choice", "invalid_value")
    if name not in (f["name"] for f in functions):
        raise ApiError(400, f"tool_choice names function {name!r}, which tools does not define (defined: "
                       f"{[f['name'] for f in functions]})", "tool_choice", "invalid_value")
    return name


def constraint(choice: Optional[str], functions: list[dict], parallel: bool = True) -> Optional[dict]:
    """GuidedDecoding arguments of a resolved tool choice: the named function's parameters, or
    for "required" an array of at least one call of any function (exactly one unless `parallel`)."""
    if choice in (None, "auto"):
        return None
    if choice != "required":
        fn = next(f for f in functions if f["name"] == choice)
        return {"json": fn.get("parameters") or ANY_OBJECT}
    calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [f["name"]]},
                                               "parameters": f.get("parameters") or ANY_OBJECT},
              "required": ["name", "parameters"]} for f in functions]
    array = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    return {"json": array if parallel else dict(array, maxItems=1)}


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def mistral_call_id() -> str:
    """A call id as Mistral's chat templates require it when the call comes back: 9 letters or digits."""
    return "".join(secrets.choice(ALPHANUMERIC) for _ in range(9))


def split_calls(choice: str, text: str, parser: Optional[ToolCallParser] = None) -> tuple[str, Optional[list[dict]]]:
    """(content, OpenAI tool calls or None) of the answer `text` of a resolved tool choice ("auto"
    text read by `parser`). A call is {"id", "type": "function", "function": {"name", "arguments":
    a JSON string}}. A named function's call carries the text as is, and "required" calls their
    parameters' text as written (`RequiredCalls`), also when a length limit cut the last one short;
    "auto" text whose calls do not parse, and "required" text with no call begun, stay the content."""
    if choice not in ("required", "auto"):
        return "", [_call(choice, text)]
    if choice == "required":
        reader = RequiredCalls()
        reader.feed(text)
        calls = [_call(name, arguments) for name, arguments in reader.calls]
        return ("", calls) if calls else (text, None)
    try:
        return parser.split(text)
    except UNPARSED:
        return text, None


CALL_CLOSE = re.compile(r"\s*\}")
REQUIRED_CALL_HEAD = re.compile(r'\s*[\[,]\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"parameters"\s*:\s*')


class RequiredCalls:
    """Reads a "required" answer (a JSON array of {"name": ..., "parameters": ...} in that key
    order, as its grammar writes it) as it grows. `calls` holds (name, parameters' text so far) of
    every call begun; `feed` returns OpenAI's streamed tool-call deltas of what the new text adds:
    a call's id, type and name once its head is complete, then its arguments as they are written."""

    def __init__(self):
        self.text, self.at = "", 0  # everything read; where the scan stands
        self.calls: list[list] = []  # [name, parameters' text]
        # the current value's kind ("container", "string", "scalar"), "ended" after it, None between calls
        self.kind: Optional[str] = None
        self.depth, self.in_string, self.escaped = 0, False, False

    def feed(self, text: str) -> list[dict]:
        self.text += text
        deltas = []
        while self.at < len(self.text):
            if self.kind == "ended":  # the value is complete: its call object's closing brace next
                close = CALL_CLOSE.match(self.text, self.at)
                if close is None:
                    break
                self.at, self.kind = close.end(), None
                continue
            if self.kind is None:
                head = REQUIRED_CALL_HEAD.match(self.text, self.at)
                if head is None or head.end() == len(self.text):
                    break  # the next call's head (and its value's first character) not written yet, or the end
                name = json.loads(f'"{head.group(1)}"')
                self.calls.append([name, ""])
                deltas.append({"index": len(self.calls) - 1, "id": call_id(), "type": "function",
                               "function": {"name": name, "arguments": ""}})
                first = self.text[head.end()]
                self.kind = "container" if first in "{[" else "string" if first == '"' else "scalar"
                self.at, self.depth, self.in_string, self.escaped = head.end(), 0, False, False
            start = self.at
            ended = self._scan()
            piece = self.text[start:self.at]
            if piece:
                self.calls[-1][1] += piece
                deltas.append({"index": len(self.calls) - 1, "function": {"arguments": piece}})
            if not ended:
                break
            self.kind = "ended"
        return deltas

    def _scan(self) -> bool:
        """Advance over the current value in the text read; True when it has ended (self.at just
        past it)."""
        text = self.text
        while self.at < len(text):
            ch = text[self.at]
            if self.kind == "scalar":
                if ch in ",}] \t\r\n":
                    return True
                self.at += 1
                continue
            self.at += 1
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.kind == "string":
                        return True
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return True
        return False


def _arguments(value) -> str:
    """A written call's arguments as a JSON string (an object, or a string already holding one)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        raise TypeError("a tool call's arguments must be an object")
    return json.dumps(value, ensure_ascii=False)


def _call(name, arguments: str, new_id=call_id) -> dict:
    if not isinstance(name, str):
        raise TypeError("a tool call's name must be a string")
    return {"id": new_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def held_back(text: str, marker: str) -> int:
    """Characters at the end of streamed "auto" content that may begin `marker` (held back until
    the next text says whether they do)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


# ---- parsers of the calls a model writes freely (tool_choice "auto") ----------------------------

# Raised by calls that do not parse (ast.parse raises MemoryError on input nested too deeply).
UNPARSED = (ValueError, KeyError, TypeError, SyntaxError, RecursionError, MemoryError)
HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"
PYTHONIC_START = re.compile(r"\s*(\[\s*([A-Za-z_]|\Z)|\Z)")  # blank, or a list whose first call may begin
BLANKS = re.compile(r"\s*")


class ToolCallParser(ABC):
    """A format of the tool calls a model writes in its answer."""

    @abstractmethod
    def split(self, text: str) -> tuple[str, Optional[list[dict]]]:
        """(content, calls) of a whole answer: (text, None) without calls; raises one of UNPARSED
        when the calls it starts do not parse."""

    @abstractmethod
    def streamable(self, text: str) -> int:
        """How many leading characters of an unfinished answer are content, whatever follows."""


class _MarkedCalls(ToolCallParser):
    """Calls after a marker; the text before the first marker is the content."""

    marker: str

    @abstractmethod
    def calls(self, text: str) -> list[dict]:
        """The calls written in `text`, which starts with the marker."""

    def split(self, text: str) -> tuple[str, Optional[list[dict]]]:
        at = text.find(self.marker)
        return (text, None) if at < 0 else (text[:at], self.calls(text[at:]))

    def streamable(self, text: str) -> int:
        at = text.find(self.marker)
        return at if at >= 0 else len(text) - held_back(text, self.marker)


class _WholeAnswerCalls(ToolCallParser):
    """Calls that are the whole answer (no content beside them); an answer whose first non-blank
    characters cannot begin a call is content."""

    @abstractmethod
    def may_be_calls(self, text: str) -> bool:
        """Whether `text` (an answer so far) is blank or starts as calls do."""

    @abstractmethod
    def calls(self, text: str) -> list[dict]:
        """The calls that make up `text`."""

    def split(self, text: str) -> tuple[str, Optional[list[dict]]]:
        return ("", self.calls(text)) if self.may_be_calls(text) else (text, None)

    def streamable(self, text: str) -> int:
        return 0 if self.may_be_calls(text) else len(text)


class Hermes(_MarkedCalls):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the last one may be unterminated)."""

    marker = "<tool_call>"

    def calls(self, text: str) -> list[dict]:
        return [_json_call(json.loads(body)) for body in HERMES_CALL.findall(text)]


class Mistral(_MarkedCalls):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``."""

    marker = "[TOOL_CALLS]"

    def calls(self, text: str) -> list[dict]:
        written = json.loads(text[len(self.marker):])
        if not isinstance(written, list) or not written:
            raise TypeError("mistral tool calls must be a non-empty JSON array")
        return [_json_call(call, mistral_call_id) for call in written]


class Llama3Json(_WholeAnswerCalls):
    """``{"name": ..., "parameters": {...}}; {...}``, optionally after ``<|python_tag|>``."""

    def may_be_calls(self, text: str) -> bool:
        start = text.lstrip()
        return start.startswith("{") or PYTHON_TAG.startswith(start[:len(PYTHON_TAG)])

    def calls(self, text: str) -> list[dict]:
        body = text.lstrip().removeprefix(PYTHON_TAG)
        decoder, calls, at = json.JSONDecoder(), [], 0
        while True:
            written, at = decoder.raw_decode(body, BLANKS.match(body, at).end())
            key = "parameters" if "parameters" in written else "arguments"
            calls.append(_call(written["name"], _arguments(written[key])))
            at = BLANKS.match(body, at).end()
            if at == len(body):
                return calls
            if body[at] != ";":
                raise ValueError("llama3_json tool calls must be separated by ';'")
            at += 1


class Pythonic(_WholeAnswerCalls):
    """``[get_weather(city="Paris"), f()]``: a Python list of calls, read and never evaluated."""

    def may_be_calls(self, text: str) -> bool:
        return PYTHONIC_START.match(text) is not None

    def calls(self, text: str) -> list[dict]:
        written = ast.parse(text.strip(), mode="eval").body
        if not isinstance(written, ast.List) or not written.elts:
            raise ValueError("pythonic tool calls must be a non-empty list of calls")
        return [_python_call(node) for node in written.elts]


def _json_call(written, new_id=call_id) -> dict:
    """The call a JSON object {"name": ..., "arguments": {...}} writes (no "arguments": none), its id from `new_id`."""
    return _call(written["name"], _arguments(written.get("arguments", {})), new_id)


def _python_call(node: ast.expr) -> dict:
    """The call `name(key=literal, ...)` written in Python."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        raise ValueError("a pythonic tool call must be name(key=value, ...)")
    arguments = {}
    for keyword in node.keywords:
        if keyword.arg is None or keyword.arg in arguments:
            raise ValueError("a pythonic tool call's arguments must be distinct keywords")
        arguments[keyword.arg] = _literal(keyword.value)
    return _call(node.func.id, json.dumps(arguments, ensure_ascii=False, allow_nan=False))


def _literal(node: ast.expr):
    """The JSON value of a Python literal: a string, number, boolean, None, list or dict with string keys."""
    if isinstance(node, ast.Constant) and (node.value is None or type(node.value) in (str, int, float, bool)):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)
            and type(node.operand.value) in (int, float)):
        return -node.operand.value
    if isinstance(node, ast.List):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) and type(k.value) is str for k in node.keys):
        return {k.value: _literal(v) for k, v in zip(node.keys, node.values)}
    raise ValueError("a pythonic tool call's arguments must be literals")


PARSERS: dict[str, ToolCallParser] = {"hermes": Hermes(), "llama3_json": Llama3Json(), "mistral": Mistral(),
                                      "pythonic": Pythonic()}
TOOL_CALL_PARSERS = tuple(PARSERS)
