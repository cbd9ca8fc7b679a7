"""Function tools on chat completions: `tools`, `tool_choice` and the answer's `tool_calls`.

The tools go to the chat template (transformers renders them as the checkpoint's template writes
tool definitions). A named `tool_choice` (`{"type": "function", "function": {"name": ...}}`) makes
the answer that function's arguments: JSON following its `parameters` schema, enforced by the same
structured-output machinery as `response_format`. `"required"` makes it a JSON array of one or more
`{"name": ..., "parameters": {...}}` calls, each following its function's schema (vLLM's form);
`parallel_tool_calls: false` limits that array to one call. `"none"` answers in text. `"auto"` (the
default when tools are given) lets the model answer freely and parses the calls it writes, which
needs a parser of the model's format (`--tool-call-parser`; without one, "auto" is a 400 naming
tool_choice, as vLLM answers without `--enable-auto-tool-choice`). Parsers:

* ``hermes``: calls written as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes,
  Qwen and the templates that follow them); the text before the first call is the content. An
  answer whose calls do not parse (cut short by a length limit) stays text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Optional

from .protocol import ApiError

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
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


TOOL_CALL_PARSERS = ("hermes",)
HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
HERMES_START = "<tool_call>"


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


def split_calls(choice: str, text: str) -> tuple[str, Optional[list[dict]]]:
    """(content, OpenAI tool calls or None) of the answer `text` of a resolved tool choice. A call
    is {"id", "type": "function", "function": {"name", "arguments": a JSON string}}. A named
    function's call carries the text as is (also when a length limit cut it short); "required"
    and "auto" text whose calls do not parse stays the content, with no calls."""
    if choice not in ("required", "auto"):
        return "", [_call(choice, text)]
    try:
        if choice == "required":
            return "", [_call(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in json.loads(text)]
        if HERMES_START not in text:
            return text, None
        calls = [json.loads(body) for body in HERMES_CALL.findall(text)]
        return text[:text.index(HERMES_START)], [_call(c["name"], _arguments(c.get("arguments", {}))) for c in calls]
    except (json.JSONDecodeError, KeyError, TypeError):
        return text, None


def _arguments(value) -> str:
    """A written call's arguments as a JSON string (an object, or a string already holding one)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        raise TypeError("a tool call's arguments must be an object")
    return json.dumps(value, ensure_ascii=False)


def _call(name, arguments: str) -> dict:
    if not isinstance(name, str):
        raise TypeError("a tool call's name must be a string")
    return {"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def held_back(text: str) -> int:
    """Characters at the end of streamed "auto" content that may begin a call marker (held back
    until the next text says whether they do)."""
    for n in range(min(len(HERMES_START) - 1, len(text)), 0, -1):
        if HERMES_START.startswith(text[-n:]):
            return n
    return 0
