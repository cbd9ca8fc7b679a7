"""OpenAI-style chat messages as chat templates take them (offline `LLM.chat` and the server).

A message is a mapping with a non-empty ``role`` (``developer`` is rendered as ``system``) and a
``content`` string or list of text parts (``{"type": "text", "text": ...}``, joined); an assistant
message may leave ``content`` out (an empty string) and carry an earlier answer's reasoning as
``reasoning_content`` or vLLM's newer ``reasoning`` (the template sees ``reasoning_content``), and
its ``tool_calls`` (OpenAI's form; each call's JSON ``arguments`` string goes to the template
parsed, as templates read them). A ``tool`` message holds a tool's result for ``tool_call_id``.
Non-text parts are not supported. Errors are `MessageError`s naming the message field
(``messages[1].content[0].type``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from .errors import RequestError

MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning")


class MessageError(RequestError):
    """A bad chat message: ``field`` names it, ``code`` is "invalid_value" or "unsupported"."""

    def __init__(self, message: str, field: str, code: str = "invalid_value"):
        super().__init__(message)
        self.field, self.code = field, code


def template_messages(messages: Sequence[Mapping], where: str = "messages") -> list[dict]:
    """{"role", "content"[, "reasoning_content"]} dicts of `messages` for the chat template."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise MessageError(f"{where} must be a non-empty list of {{'role': ..., 'content': ...}} objects", where)
    return [template_message(m, f"{where}[{i}]") for i, m in enumerate(messages)]


def template_message(m, where: str) -> dict:
    """One message as the chat template takes it; `where` names it in errors ("messages[2]")."""
    if not isinstance(m, Mapping):
        raise MessageError(f"{where} must be an object with 'role' and 'content', got {type(m).__name__}", where)
    unknown = sorted(set(m) - set(MESSAGE_KEYS))
    if unknown:
        raise MessageError(f"{where} has unknown keys {unknown} (allowed: {', '.join(MESSAGE_KEYS)})", where)
    role = m.get("role")
    if not isinstance(role, str) or not role:
        raise MessageError(f"{where}.role must be a non-empty string, got {role!r}", f"{where}.role")
    message = {"role": "system" if role == "developer" else role, "content": _content(m.get("content"), role, where)}
    if m.get("tool_calls"):
        if role != "assistant":
            raise MessageError(f"{where}.tool_calls: only assistant messages carry tool calls", f"{where}.tool_calls")
        message["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
    tool_call_id = m.get("tool_call_id")
    if role == "tool":
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise MessageError(f"{where}.tool_call_id: a tool message needs the id of the call it answers",
                               f"{where}.tool_call_id")
        message["tool_call_id"] = tool_call_id
    elif tool_call_id is not None:
        raise MessageError(f"{where}.tool_call_id: only tool messages carry one", f"{where}.tool_call_id")
    if role == "tool" and isinstance(m.get("name"), str):
        message["name"] = m["name"]
    reasoning, reasoning_content = m.get("reasoning"), m.get("reasoning_content")
    for name, value in (("reasoning", reasoning), ("reasoning_content", reasoning_content)):
        if value is not None and not isinstance(value, str):
            raise MessageError(f"{where}.{name} must be a string, got {type(value).__name__}", f"{where}.{name}")
    if reasoning is not None and reasoning_content is not None and reasoning != reasoning_content:
        raise MessageError(f"{where}: reasoning and reasoning_content disagree; give one", f"{where}.reasoning")
    if reasoning_content is not None or reasoning is not None:
        message["reasoning_content"] = reasoning_content if reasoning_content is not None else reasoning
    return message


def _tool_calls(calls, where: str) -> list[dict]:
    """An assistant message's tool calls as templates read them: {"id", "type": "function",
    "function": {"name", "arguments": the parsed JSON object}}."""
    if not isinstance(calls, (list, tuple)):
        raise MessageError(f"{where} must be a list of tool calls", where)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(fn, Mapping) or call.get("type", "function") != "function" or not isinstance(name, str):
            raise MessageError(f"{where}[{j}] must be {{'id': ..., 'type': 'function', 'function': {{'name': ..., "
                               "'arguments': ...}}}}", f"{where}[{j}]")
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                raise MessageError(f"{where}[{j}].function.arguments is not valid JSON: {exc}",
                                   f"{where}[{j}].function.arguments") from None
        if not isinstance(arguments, Mapping):
            raise MessageError(f"{where}[{j}].function.arguments must be a JSON object",
                               f"{where}[{j}].function.arguments")
        entry = {"type": "function", "function": {"name": name, "arguments": dict(arguments)}}
        if call.get("id") is not None:
            entry["id"] = call["id"]
        out.append(entry)
    return out


def _content(content, role: str, where: str) -> str:
    """A message's content as one string (text parts joined; none: "" for the assistant)."""
    if content is None:
        if role != "assistant":
            raise MessageError(f"{where}.content must be a string or a list of text parts", f"{where}.content")
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise MessageError(f"{where}.content must be a string or a list of text parts, got {type(content).__name__}",
                           f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        text = part.get("text") if isinstance(part, Mapping) else None
        if kind != "text" or not isinstance(text, str):
            raise MessageError(f"{where}.content[{j}]: content type {kind!r} is not supported; only text parts "
                               "({'type': 'text', 'text': ...}) are accepted", f"{where}.content[{j}].type",
                               "unsupported")
        texts.append(text)
    return "".join(texts)
