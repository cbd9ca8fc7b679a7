"""OpenAI's Responses API (POST /v1/responses): text and function calls.

`input` is a string (one user message) or a list of message items (`{"role", "content"}`, content a
string or `input_text` / `output_text` parts; `"type": "message"` optional) and reasoning items of
earlier responses (their text becomes the following assistant message's `reasoning_content`);
`instructions` comes first as a system message. The conversation is rendered by the chat template as a chat request's
is, and generation stops on the template's end-of-turn tokens. Sampling: `max_output_tokens`,
`temperature`, `top_p`, and vLLM's `top_k`, `min_p`, `repetition_penalty`, `seed`; `text.format`
(`text`, `json_object`, `json_schema`) constrains the output as `response_format` does on chat.

The response's `output` holds a `reasoning` item (when a reasoning parser split one off: its text
as `reasoning_text` content) and then the `message` item (one `output_text` part). `status` is
`completed`, or `incomplete` with `incomplete_details.reason` "max_output_tokens".
`usage.output_tokens_details.reasoning_tokens` counts the tokens up to the end of the reasoning.
Streamed, the events are OpenAI's: `response.created`, `response.in_progress`, for each item
`response.output_item.added`, `response.content_part.added`, text deltas
(`response.reasoning_text.delta` / `response.output_text.delta`), their `.done` events and
`response.output_item.done`, then `response.completed` (or `response.incomplete`) carrying the
whole response, every event numbered by `sequence_number`.

A response is stored (`store`, OpenAI's default true; response_store.py): `previous_response_id`
continues its conversation, and GET /v1/responses/{id}, DELETE /v1/responses/{id} and GET
/v1/responses/{id}/input_items read or drop it.

Function tools (`{"type": "function", "name", "description", "parameters", "strict"}`) and
`tool_choice` (`"none"`, `"auto"`, `"required"`, `{"type": "function", "name"}`) work as on chat
completions (tools.py): the calls come as `function_call` output items (after the message item when
an "auto" answer wrote text first); streamed, the arguments of a named function's call and of
"required" calls grow as they are written, and the calls of "auto" come whole when the answer ends. Earlier `function_call`
items and `function_call_output` items come back as input.

Not supported (a 400 naming the field unless neutral): tools other than functions, `conversation`
objects, stored `prompt`s, `background`, `truncation: "auto"`, `top_logprobs` and `include` of
output logprobs, and other input items or parts other than text.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, ClassVar, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ...chat_messages import MessageError, template_message
from ...guided_decoding import GuidedDecoding
from ...sampling_params import MAX_INT32, SamplingParams
from .protocol import ApiError, _LoopFields, _ToolFields, response_format_constraint, sampling_fields, unsupported

TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(_ToolFields, _LoopFields):
    """POST /v1/responses (with rlt's loop controls: min_loops, max_loops, exit_threshold, speculative,
    priority)."""

    model: Optional[str] = Field(None, description="a served model id; null or absent: the first (vLLM's rule)")
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = Field(None, ge=1, description="null: up to the end of the context")
    temperature: Optional[float] = Field(None, ge=0.0, le=100.0, description="default 1.0; 0 is greedy")
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=-1, le=MAX_INT32, description="vLLM: -1 or 0: off")
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0, description="vLLM")
    repetition_penalty: Optional[float] = Field(None, gt=0.0, le=100.0, description="vLLM: default 1")
    seed: Optional[int] = Field(None, ge=0, lt=2**63, description="vLLM")
    stream: Optional[bool] = False
    stream_options: Optional[dict[str, Any]] = Field(None, description="include_obfuscation: accepted, no effect")
    text: Optional[dict[str, Any]] = Field(None, description="{'format': {'type': 'text' | 'json_object' | "
                                                            "'json_schema', ...}, 'verbosity': ...}")
    reasoning: Optional[dict[str, Any]] = Field(None, description="effort and summary: accepted, no effect")
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = Field(None, description="false: tool_choice 'required' makes one call")
    include: Optional[list[str]] = None
    truncation: Optional[str] = None
    background: Optional[bool] = None
    previous_response_id: Optional[str] = Field(None, min_length=1, description="continue a stored response")
    store: Optional[bool] = Field(True, description="keep the response for previous_response_id and GET (default)")
    conversation: Optional[Union[str, dict[str, Any]]] = None
    prompt: Optional[dict[str, Any]] = None
    top_logprobs: Optional[int] = None
    max_tool_calls: Optional[int] = None

    num_samples: ClassVar[int] = 1  # one output per response (`admit` counts sequences by it)

    def chat_tools(self) -> Optional[list]:
        """`tools` in chat completions' form: a function's fields sit beside its type here."""
        tools = []
        for i, tool in enumerate(self.tools or []):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                kind = tool.get("type") if isinstance(tool, dict) else None
                raise ApiError(400, f"tools[{i}].type must be 'function' (the only tool type this server has), "
                               f"got {kind!r}", f"tools[{i}].type", "unsupported")
            tools.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
        return tools

    def chat_tool_choice(self) -> Any:
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
            return {"type": "function", "function": {k: v for k, v in choice.items() if k != "type"}}
        return choice

    @property
    def functions_given(self) -> list[dict]:
        try:
            return super().functions_given
        except ApiError as exc:  # name the field as this request spells it
            raise ApiError(exc.status, exc.message.replace(".function", ""), exc.param.replace(".function", ""),
                           exc.code) from None

    def check_neutral(self) -> None:
        """400s naming what this server does not do (see the module docstring)."""
        for name in ("conversation", "prompt"):
            if getattr(self, name) is not None:
                raise ApiError(400, f"{name} is not supported by this server: it stores no conversations or prompts "
                               "(only null is accepted; previous_response_id continues a stored response)", name,
                               "unsupported")
        if self.background:
            raise unsupported("background", "null or false")
        if self.truncation not in (None, "disabled"):
            raise unsupported("truncation", "null or 'disabled'")
        if self.top_logprobs not in (None, 0):
            raise unsupported("top_logprobs", "null or 0")
        if self.include and "message.output_text.logprobs" in self.include:
            raise ApiError(400, "include: 'message.output_text.logprobs' is not supported by this server", "include",
                           "unsupported")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true", "stream_options")

    def input_items(self) -> list[dict]:
        """`input` as a list of items, each with an id (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": self.input}]}]
        if not self.input:
            raise ApiError(400, "input must be a string or a non-empty list of message items", "input")
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
        return [item if "id" in item else {"id": f"{prefix.get(item.get('type', 'message'), 'item')}_{uuid.uuid4().hex}",
                                           **item} for item in self.input]

    def messages(self, earlier: Optional[list[dict]] = None) -> list[dict]:
        """The conversation as the chat template takes it (`chat_messages`): instructions first, the
        `earlier` items (a stored conversation's, which the input continues), then the input. An
        earlier response's function calls join the assistant message before them (or make one), and
        a function_call_output item is a tool message."""
        own = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        if not own:
            raise ApiError(400, "input must be a string or a non-empty list of message items", "input")
        items = [*(earlier or ()), *own]
        first = len(items) - len(own)  # items before it are named previous_response_id's
        raw = [({"role": "system", "content": self.instructions}, "instructions")] if self.instructions is not None \
            else []
        reasoning = None  # a reasoning item's text, for the assistant message that follows it
        calls_join = False  # whether a function call joins the last message (an assistant's, just before)
        for i, item in enumerate(items):
            where = f"input[{i - first}]" if i >= first else "previous_response_id"
            kind = item.get("type", "message")
            if kind == "reasoning":
                reasoning = (reasoning or "") + _reasoning_text(item, where)
                continue
            if kind == "function_call":
                call = _function_call(item, where)
                if not calls_join:
                    raw.append(({"role": "assistant", "content": None, "tool_calls": []}, where))
                raw[-1][0].setdefault("tool_calls", []).append(call)
                message = raw[-1][0]
            elif kind == "function_call_output":
                if not isinstance(item.get("call_id"), str) or not item["call_id"]:
                    raise ApiError(400, f"{where}.call_id must be the id of the function call it answers",
                                   f"{where}.call_id", "invalid_value")
                message = {"role": "tool", "tool_call_id": item["call_id"],
                           "content": _output_text(item.get("output"), f"{where}.output")}
                raw.append((message, where))
            elif kind == "message":
                message = {k: v for k, v in item.items() if k not in ("type", "id", "status")}
                content = message.get("content")
                if isinstance(content, list):
                    message["content"] = [_text_part(part, f"{where}.content[{j}]") for j, part in enumerate(content)]
                raw.append((message, where))
            else:
                raise ApiError(400, f"{where}: input items of type {kind!r} are not supported; only messages, "
                               "reasoning, function_call and function_call_output are", f"{where}.type", "unsupported")
            if reasoning is not None and message.get("role") == "assistant" and "reasoning_content" not in message:
                message["reasoning_content"] = reasoning
            reasoning = None  # reasoning not followed by its answer is dropped (templates drop old reasoning)
            calls_join = message.get("role") == "assistant"
        try:
            return [template_message(message, where) for message, where in raw]
        except MessageError as exc:
            raise ApiError(400, str(exc), exc.field, exc.code) from None

    def guided(self) -> Optional[GuidedDecoding]:
        """The constraint of `text.format` or of the tool choice (at most one of them)."""
        text, tool = self.text_constraint(), self.tool_constraint()
        if text is not None and tool is not None:
            raise ApiError(400, "tool_choice: a text.format constraint and a tool choice that constrains the answer "
                           "(required or a named function) cannot both be given", "tool_choice", "invalid_value")
        return text or (None if tool is None else GuidedDecoding(**tool, origin="tool_choice"))

    def text_constraint(self) -> Optional[GuidedDecoding]:
        """`text.format` as a constraint (json_schema's fields sit beside its type here)."""
        fmt = (self.text or {}).get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, dict):
            raise ApiError(400, "text.format must be an object with a 'type'", "text")
        if fmt.get("type") == "json_schema":
            spec = {k: v for k, v in fmt.items() if k != "type"}
            fmt = {"type": "json_schema", "json_schema": spec}
        try:
            given = response_format_constraint(fmt)
        except ApiError as exc:
            raise ApiError(400, exc.message.replace("response_format", "text.format"), "text", exc.code) from None
        return None if given is None else GuidedDecoding(**given, origin="text")

    def sampling_params(self, stop_token_ids: tuple, defaults: Optional[dict] = None) -> SamplingParams:
        """The engine's SamplingParams (ConfigError naming the field); `defaults` as chat completions take them."""
        return SamplingParams(
            seed=self.seed, stop_token_ids=list(stop_token_ids) or None, guided=self.guided(),
            **sampling_fields(self, self.max_output_tokens, defaults), **self.loop_controls())


def _reasoning_text(item: dict, where: str) -> str:
    """The text of a reasoning input item (an earlier response's): its reasoning_text parts."""
    parts = item.get("content") or []
    if not isinstance(parts, list) or not all(isinstance(p, dict) and p.get("type") == "reasoning_text"
                                              and isinstance(p.get("text"), str) for p in parts):
        raise ApiError(400, f"{where}.content must be a list of {{'type': 'reasoning_text', 'text': ...}} parts",
                       f"{where}.content")
    return "".join(p["text"] for p in parts)


def _function_call(item: dict, where: str) -> dict:
    """An earlier response's function_call item as a chat tool call."""
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    for field, value in (("call_id", call_id), ("name", name), ("arguments", arguments)):
        if not isinstance(value, str) or not value:
            raise ApiError(400, f"{where}.{field} must be a non-empty string", f"{where}.{field}", "invalid_value")
    try:
        if not isinstance(json.loads(arguments), dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise ApiError(400, f"{where}.arguments must be a JSON object: {exc}", f"{where}.arguments",
                       "invalid_value") from None
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _output_text(output, where: str) -> str:
    """A function_call_output's output: a string, or text parts joined."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(_text_part(part, f"{where}[{j}]")["text"] for j, part in enumerate(output))
    raise ApiError(400, f"{where} must be a string or a list of text parts", where)


def _text_part(part, where: str) -> dict:
    """An input or output text part as a chat text part (400 naming other parts)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
        raise ApiError(400, f"{where}: content type {kind!r} is not supported; only text parts ('input_text', "
                       "'output_text') are accepted", f"{where}.type", "unsupported")
    return {"type": "text", "text": part["text"]}


class ResponseObject(BaseModel):
    """A response (or one of its streamed events) as built by `Responses`: the JSON as given."""

    model_config = ConfigDict(extra="allow")


class Responses:
    """Builds one request's response object, its output items and its streamed events."""

    def __init__(self, body: ResponsesRequest, model: str, stored: bool = False):
        """stored: whether the finished response is kept (echoed as `store`)."""
        self.body, self.model, self.stored = body, model, stored
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.reasoning_id, self.message_id = f"rs_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
        self.sequence = 0

    def reasoning_item(self, text: str, status: str = "completed") -> dict:
        return {"id": self.reasoning_id, "type": "reasoning", "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": text}] if text or status == "completed" else []}

    @staticmethod
    def function_call_item(call: dict, status: str = "completed") -> dict:
        """A tool call (tools.split_calls) as a function_call output item (its call id as call_id)."""
        fn = call["function"]
        return {"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "call_id": call["id"], "name": fn["name"],
                "arguments": fn["arguments"], "status": status}

    def message_item(self, text: Optional[str], status: str = "completed") -> dict:
        content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"id": self.message_id, "type": "message", "role": "assistant", "status": status, "content": content}

    def response(self, output: list[dict], status: str, usage: Optional[dict]) -> dict:
        body = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": output, "usage": usage, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "temperature": body.temperature, "top_p": body.top_p,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "tool_choice": body.tool_choice or ("auto" if body.tools else "none"), "tools": body.tools or [],
            "text": body.text or {"format": {"type": "text"}},
            "reasoning": body.reasoning, "truncation": "disabled", "store": self.stored, "background": False,
            "metadata": None, "previous_response_id": body.previous_response_id,
        }

    def event(self, kind: str, **fields) -> ResponseObject:
        """One streamed event of type `kind`, numbered."""
        self.sequence += 1
        return ResponseObject(type=kind, sequence_number=self.sequence - 1, **fields)
