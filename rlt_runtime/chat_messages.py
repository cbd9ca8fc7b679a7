"""OpenAI-style chat messages as chat templates take them (offline `LLM.chat` and the server).

A message is a mapping with a non-empty ``role`` (``developer`` is rendered as ``system``) and a
``content`` string or list of text parts (``{"type": "text", "text": ...}``, joined); an assistant
message may leave ``content`` out (an empty string) and carry an earlier answer's reasoning as
``reasoning_content`` or vLLM's newer ``reasoning`` (the template sees ``reasoning_content``). Tool
messages, tool calls and non-text parts are not supported. Errors are `MessageError`s naming the
message field (``messages[1].content[0].type``).
"""

from __future__ import annotations

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
    if role == "tool" or m.get("tool_calls") or m.get("tool_call_id") is not None:
        raise MessageError(f"{where}: tool messages and tool calls are not supported", where, "unsupported")
    message = {"role": "system" if role == "developer" else role, "content": _content(m.get("content"), role, where)}
    reasoning, reasoning_content = m.get("reasoning"), m.get("reasoning_content")
    for name, value in (("reasoning", reasoning), ("reasoning_content", reasoning_content)):
        if value is not None and not isinstance(value, str):
            raise MessageError(f"{where}.{name} must be a string, got {type(value).__name__}", f"{where}.{name}")
    if reasoning is not None and reasoning_content is not None and reasoning != reasoning_content:
        raise MessageError(f"{where}: reasoning and reasoning_content disagree; give one", f"{where}.reasoning")
    if reasoning_content is not None or reasoning is not None:
        message["reasoning_content"] = reasoning_content if reasoning_content is not None else reasoning
    return message


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
