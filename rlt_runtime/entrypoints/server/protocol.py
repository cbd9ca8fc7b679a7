"""The HTTP contract: pydantic models mirroring the OpenAI schema, the error body, SSE framing.

Requests are strict: JSON types must match exactly (no "5" for 5, no 1.0 for an integer) and
fields this server does not know are rejected with 400 naming the field (the OpenAI API does
the same); the OpenAI and vLLM fields it knows without implementing are listed in
field_policy.py. OpenAI features the engine lacks are accepted only at their neutral value
(`suffix: ""`, `functions: []`, ...); anything else is a 400 that says the feature is not supported.
Sampling fields beyond OpenAI's `presence_penalty`, `frequency_penalty`, `logit_bias` ({token id
string: bias in [-100, 100]}) and `best_of`: vLLM's `top_k`, `min_p`, `stop_token_ids`, `ignore_eos`,
`repetition_penalty`, `min_tokens`, `bad_words`, and rlt's `min_loops`, `max_loops`, `exit_threshold`,
`speculative`, `priority`, `trace_id`. Other vLLM extensions: `prompt_logprobs`, `skip_special_tokens`,
`include_stop_str_in_output`, `add_special_tokens`, `stream_options.continuous_usage_stats`, structured
output (`guided_*`, `structural_tag`, `structured_outputs`, `response_format` on completions too) and, on
chat, `add_generation_prompt`, `continue_final_message`, `chat_template_kwargs`, `chat_template` (with
`--trust-request-chat-template`) and `documents`; `allowed_token_ids`, `truncate_prompt_tokens` with
`truncation_side`, `thinking_token_budget` and `return_tokens_as_token_ids`. Chat answers carry
`reasoning_content` when a reasoning parser runs (reasoning.py), and `tool_calls` when `tools` and a
`tool_choice` ask for them (tools.py).
Every response choice (and streamed chunk choice) carries rlt's `exit_depths`: the loops each
token it adds ran, as `CompletionOutput.exit_depths` offline.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, computed_field, model_serializer, model_validator

from ...chat_messages import MessageError, template_messages as chat_template_messages
from ...beam_search import MAX_BEAM_WIDTH, BeamSearchParams, beam_params
from ...guided_decoding import KINDS as GUIDED_KINDS, GuidedDecoding
from ...sampling_params import MAX_INT32, MAX_LOGIT_BIAS_VALUE, MAX_LOGPROBS, MAX_SAMPLES, SamplingParams

NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenId = Annotated[int, Field(ge=0)]
Bias = Annotated[float, Field(ge=-MAX_LOGIT_BIAS_VALUE, le=MAX_LOGIT_BIAS_VALUE)]


class ApiError(Exception):
    """An error answered with the OpenAI error body and `status`."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             408: "timeout_error", 413: "invalid_request_error", 429: "rate_limit_error", 500: "internal_error",
             503: "service_unavailable", 504: "timeout_error"}

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers

    def body(self) -> dict:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.TYPES.get(self.status, "error"),
                                             param=self.param, code=self.code)).model_dump()


def unsupported(field: str, neutral: str) -> ApiError:
    return ApiError(400, f"{field} is not supported by this server (only {neutral} is accepted)", field, "unsupported")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: Optional[bool] = None
    include_obfuscation: Optional[bool] = None  # accepted, no effect (no obfuscation padding is sent)
    continuous_usage_stats: Optional[bool] = Field(
        None, description="vLLM: with include_usage, every chunk carries the usage so far")


class _LoopFields(_Strict):
    """rlt's per-request loop and scheduling controls (completions, chat completions, responses)."""

    min_loops: Optional[int] = Field(None, ge=1, description="rlt: fewest loops a generated token runs")
    max_loops: Optional[int] = Field(None, ge=1, description="rlt: most loops a generated token runs")
    exit_threshold: Optional[float] = Field(None, ge=0.0, le=1.0,
                                            description="rlt: exit-gate threshold (1 = fixed depth)")
    speculative: Optional[bool] = Field(True, description="rlt: false opts this request out of speculative decoding")
    priority: Optional[int] = Field(0, description="rlt/vLLM: lower runs first under the priority scheduling policy")

    def loop_controls(self) -> dict:
        """The SamplingParams arguments of these fields (null: the default)."""
        return dict(min_loops=self.min_loops, max_loops=self.max_loops,
                    exit_threshold=1.0 if self.exit_threshold is None else float(self.exit_threshold),
                    priority=0 if self.priority is None else self.priority,
                    speculative=True if self.speculative is None else self.speculative)


def sampling_fields(body, max_tokens: Optional[int], defaults: Optional[dict]) -> dict:
    """SamplingParams' max_tokens, temperature, top_p, top_k, min_p and repetition_penalty from a
    request `body`: its values, else `defaults` (the model's generation_config.json), else the
    neutral ones. top_k 0 (either source) is -1, off."""
    defaults = defaults or {}

    def pick(name: str, neutral):
        value = getattr(body, name)
        return defaults.get(name, neutral) if value is None else value

    top_k = pick("top_k", -1)
    return dict(max_tokens=defaults.get("max_tokens") if max_tokens is None else max_tokens,
                temperature=float(pick("temperature", 1.0)), top_p=float(pick("top_p", 1.0)),
                top_k=-1 if top_k == 0 else top_k, min_p=float(pick("min_p", 0.0)),
                repetition_penalty=float(pick("repetition_penalty", 1.0)))


class _SamplingFields(_LoopFields):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: Optional[str] = Field(None, description="a served model id; null or absent: the first (vLLM's rule)")
    n: Optional[int] = Field(1, ge=1, le=64)
    temperature: Optional[float] = Field(None, ge=0.0, le=100.0, description="default 1.0; 0 is greedy")
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=-1, le=MAX_INT32, description="-1 or 0: off")
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    seed: Optional[int] = Field(None, ge=0, lt=2**63)
    stop: Optional[Union[NonEmptyStr, list[NonEmptyStr]]] = None
    stop_token_ids: Optional[list[TokenId]] = None
    ignore_eos: Optional[bool] = False
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    prompt_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS,
                                           description="vLLM: log-probabilities of the prompt tokens with the top N")
    skip_special_tokens: Optional[bool] = Field(True, description="vLLM: false keeps special tokens in the text")
    include_stop_str_in_output: Optional[bool] = Field(
        False, description="vLLM: true keeps a matched stop string at the end of the text")
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0, description="default 0: output tokens only")
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0, description="default 0: output tokens only")
    repetition_penalty: Optional[float] = Field(None, gt=0.0, le=100.0,
                                                description="vLLM: default 1; prompt and output tokens")
    logit_bias: Optional[dict[str, Bias]] = Field(None, description="{token id as a string: bias in [-100, 100]}")
    min_tokens: Optional[int] = Field(None, ge=0, description="vLLM: EOS and stop_token_ids are held back until then")
    bad_words: Optional[list[NonEmptyStr]] = Field(None, description="vLLM: words that are never generated")
    best_of: Optional[int] = Field(None, ge=1, le=MAX_SAMPLES,
                                   description="samples generated; the n with the highest cumulative logprob return")
    trace_id: Optional[Union[NonEmptyStr, list[NonEmptyStr]]] = Field(
        None, description="rlt: the exit-trace entry each prompt replays or is recorded under (one id per prompt)")
    guided_json: Optional[Union[dict[str, Any], str]] = Field(None, description="vLLM: a JSON schema the output follows")
    guided_regex: Optional[str] = Field(None, description="vLLM: a regular expression the output matches")
    guided_choice: Optional[list[str]] = Field(None, description="vLLM: the output is one of these strings")
    guided_grammar: Optional[str] = Field(None, description="vLLM: an EBNF grammar (xgrammar's dialect) the output "
                                          "derives")
    structural_tag: Optional[Union[dict[str, Any], str]] = Field(
        None, description="vLLM: an xgrammar structural tag (tagged segments of the text follow schemas)")
    response_format: Optional[dict[str, Any]] = Field(
        None, description="OpenAI: {'type': 'text' | 'json_object' | 'json_schema'}; vLLM: also 'structural_tag' "
                          "(with 'structures' and 'triggers', or xgrammar's 'format'), on completions too")
    return_token_ids: Optional[bool] = Field(
        None, description="vLLM: the choices carry their generated token ids (`token_ids`; streamed: each chunk's "
                          "new ones) and the prompt's (`prompt_token_ids`: per choice on completions, on the "
                          "response on chat; streamed: in each choice's first chunk)")
    allowed_token_ids: Optional[list[TokenId]] = Field(
        None, min_length=1, description="vLLM: the only token ids the output may hold")
    truncate_prompt_tokens: Optional[int] = Field(
        None, ge=-1, le=MAX_INT32, description="vLLM: keep the last k prompt tokens (-1: as many as the context takes "
                                               "with room for one output token)")
    truncation_side: Optional[Literal["left", "right"]] = Field(
        None, description="vLLM: with truncate_prompt_tokens, 'left' (default) keeps the last tokens, 'right' the first")
    use_beam_search: Optional[bool] = Field(
        False, description="vLLM: n beams searched (beam_search.py); the response's choices are the best n, best first")
    length_penalty: Optional[float] = Field(
        None, allow_inf_nan=False, description="vLLM: with use_beam_search, beams rank by cum_logprob / length ** it "
                                               "(default 1)")
    repetition_detection: Optional[dict[str, Any]] = Field(
        None, description="vLLM: {max_pattern_size, min_pattern_size, min_count}: stop when the output ends in a "
                          "pattern repeated min_count times")
    max_repetition_pattern_size: Optional[int] = Field(None, ge=0, description="vLLM: repetition_detection's, flat")
    min_repetition_pattern_size: Optional[int] = Field(None, ge=0, description="vLLM: repetition_detection's, flat")
    repetition_min_count: Optional[int] = Field(None, ge=0, description="vLLM: repetition_detection's, flat")
    thinking_token_budget: Optional[int] = Field(
        None, ge=-1, le=MAX_INT32, description="vLLM: reasoning tokens before </think> is forced (-1: no limit)")
    return_tokens_as_token_ids: Optional[bool] = Field(
        None, description="vLLM: logprobs name tokens as 'token_id:N' (also rlt-serve --return-tokens-as-token-ids)")
    structured_outputs: Optional[dict[str, Any]] = Field(
        None, description="vLLM: one of json, regex, choice, grammar, json_object, structural_tag (as the guided_* "
                          "fields take them), with the options disable_any_whitespace, disable_additional_properties "
                          "and disable_fallback (held whatever their value) and whitespace_pattern (null only)")

    _GUIDED: ClassVar[dict] = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                               "guided_grammar": "grammar", "structural_tag": "structural_tag"}

    _NULL_DEFAULTS: ClassVar[dict] = {"n": 1, "ignore_eos": False, "stream": False, "speculative": True, "priority": 0,
                                      "use_beam_search": False,
                                      "skip_special_tokens": True, "include_stop_str_in_output": False}

    @model_validator(mode="after")
    def _nulls_mean_defaults(self):
        """OpenAI marks these fields nullable: an explicit null means the default."""
        for name, default in self._NULL_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, default)
        return self

    def check_neutral(self) -> None:
        """Reject OpenAI features the engine does not implement (unless given at their neutral value)."""
        if self.best_of is not None and self.best_of < self.n:
            raise ApiError(400, f"best_of ({self.best_of}) must be at least n ({self.n})", "best_of", "invalid_value")
        if self.best_of is not None and self.best_of > self.n and self.stream:
            raise ApiError(400, "best_of > n cannot stream (the best samples are known only at the end)", "best_of",
                           "invalid_value")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true", "stream_options")
        if self.use_beam_search:
            for name, bad in (("stream", self.stream), ("trace_id", self.trace_id is not None),
                              ("n", self.n > MAX_BEAM_WIDTH)):
                if bad:
                    raise ApiError(400, f"{name}: use_beam_search takes n in 1..{MAX_BEAM_WIDTH}, no stream and no "
                                   "trace_id", name, "invalid_value")
        elif self.length_penalty not in (None, 1.0):
            raise ApiError(400, "length_penalty applies only with use_beam_search", "length_penalty", "invalid_value")
        if self.truncate_prompt_tokens == 0:
            raise ApiError(400, "truncate_prompt_tokens must be -1 or at least 1 (null: no truncation)",
                           "truncate_prompt_tokens", "invalid_value")

    @property
    def num_samples(self) -> int:
        """Engine sequences per prompt: best_of when given, else n."""
        return self.best_of or self.n

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage in every streamed chunk (vLLM: include_usage and continuous_usage_stats)."""
        return self.include_usage and bool(self.stream_options.continuous_usage_stats)

    def sampling_params(self, max_tokens: Optional[int], logprobs: Optional[int], extra_stop_token_ids: tuple = (),
                        prompt_logprobs: Optional[int] = None, defaults: Optional[dict] = None) -> SamplingParams:
        """The engine's SamplingParams (raises ConfigError naming the field); `defaults` (the model's
        generation_config.json, models/generation_defaults.py) fill the sampling fields left out."""
        stop_ids = list(self.stop_token_ids or ())
        stop_ids += [t for t in extra_stop_token_ids if t not in stop_ids]
        return SamplingParams(
            presence_penalty=float(self.presence_penalty or 0.0), frequency_penalty=float(self.frequency_penalty or 0.0),
            logit_bias=self.token_bias(), min_tokens=self.min_tokens or 0, bad_words=self.bad_words,
            n=self.n, seed=self.seed, stop=self.stop,
            stop_token_ids=stop_ids or None, ignore_eos=self.ignore_eos, logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs if prompt_logprobs is None else prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens, include_stop_str_in_output=self.include_stop_str_in_output,
            best_of=self.best_of, guided=self.guided(), allowed_token_ids=self.allowed_token_ids,
            truncate_prompt_tokens=self.truncate_prompt_tokens, truncation_side=self.truncation_side or "left",
            thinking_token_budget=self.thinking_token_budget, repetition_detection=self.repetition(),
            **sampling_fields(self, max_tokens, defaults), **self.loop_controls(),
        )

    def repetition(self) -> Optional[dict]:
        """`repetition_detection`, or its three flat fields as one (400 when both forms are given)."""
        flat = {key: value for key, value in (("max_pattern_size", self.max_repetition_pattern_size),
                                              ("min_pattern_size", self.min_repetition_pattern_size),
                                              ("min_count", self.repetition_min_count)) if value is not None}
        if flat and self.repetition_detection is not None:
            raise ApiError(400, "give repetition_detection or its flat fields (max_repetition_pattern_size, ...), not "
                           "both", "repetition_detection", "invalid_value")
        return self.repetition_detection if self.repetition_detection is not None else flat or None

    def search_params(self, params: SamplingParams, room: int) -> Union[SamplingParams, BeamSearchParams]:
        """`params`, or with use_beam_search the beam search they ask for (max_tokens: theirs, else
        `room`, what the context leaves); raises ConfigError naming a field beam search cannot take."""
        if not self.use_beam_search:
            return params
        constraints = self.guided_fields()
        if constraints:
            name = constraints[0][0]
            raise ApiError(400, f"{name} cannot be combined with use_beam_search", name, "invalid_value")
        return beam_params(params, params.max_tokens or room, 1.0 if self.length_penalty is None else self.length_penalty)

    def guided_fields(self) -> list[tuple[str, dict]]:
        """(request field, GuidedDecoding arguments) of every constraint the request sets:
        `response_format` first, then vLLM's fields."""
        fields = [(name, {kind: getattr(self, name)}) for name, kind in self._GUIDED.items()
                  if getattr(self, name) is not None]
        given = [("response_format", response_format_constraint(self.response_format)),
                 ("structured_outputs", structured_outputs_constraint(self.structured_outputs))]
        return [(name, guided) for name, guided in given if guided is not None] + fields

    def guided(self) -> Optional[GuidedDecoding]:
        """The request's structured-output constraint, if any (400 naming the field: at most one may be given)."""
        given = self.guided_fields()
        if not given:
            return None
        if len(given) > 1:
            names = [name for name, _ in given]
            raise ApiError(400, f"{names[1]}: give at most one structured-output constraint, got {names}", names[1],
                           "invalid_value")
        name, kwargs = given[0]
        return GuidedDecoding(**kwargs, origin=name)


    def token_bias(self) -> Optional[dict[int, float]]:
        """`logit_bias` keyed by integer token ids (400 naming the field for a key that is not one)."""
        if not self.logit_bias:
            return None
        bias = {}
        for key, value in self.logit_bias.items():
            if not key.isascii() or not key.isdigit() or len(key) > 10:
                raise ApiError(400, f"logit_bias keys must be token ids written as decimal strings, got {key!r}",
                               "logit_bias", "invalid_value")
            bias[int(key)] = float(value)
        return bias

    def trace_ids(self, num_prompts: int) -> Optional[list[str]]:
        """`trace_id` as one id per prompt (a string counts as a list of one), or None."""
        if self.trace_id is None:
            return None
        ids = [self.trace_id] if isinstance(self.trace_id, str) else list(self.trace_id)
        if len(ids) != num_prompts:
            raise ApiError(400, f"trace_id must give one trace id per prompt ({num_prompts}), got {len(ids)}",
                           "trace_id", "invalid_value")
        return ids


PromptInput = Union[str, list[str], list[TokenId], list[list[TokenId]]]


class CompletionRequest(_SamplingFields):
    """POST /v1/completions."""

    prompt: PromptInput = Field(description="a string, a list of strings, a token-id list or a list of token-id lists")
    max_tokens: Optional[int] = Field(16, ge=0, description="null: up to the end of the context; 0 only with echo "
                                      "(the prompt alone, nothing generated)")
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS, description="with echo, the prompt tokens' too")
    echo: Optional[bool] = False
    suffix: Optional[str] = None
    add_special_tokens: Optional[bool] = Field(True, description="vLLM: add the tokenizer's special tokens (e.g. BOS) "
                                               "to text prompts")

    _NULL_DEFAULTS: ClassVar[dict] = {**_SamplingFields._NULL_DEFAULTS, "echo": False, "add_special_tokens": True}

    def check_neutral(self) -> None:
        super().check_neutral()
        if self.suffix:
            raise unsupported("suffix", "null or an empty string")
        if self.max_tokens == 0 and not self.echo:
            raise ApiError(400, "max_tokens must be at least 1 (0 only with echo, which returns the prompt alone)",
                           "max_tokens", "invalid_value")

    @property
    def echo_only(self) -> bool:
        """echo with max_tokens 0: the prompt (and its log-probabilities) alone."""
        return bool(self.echo) and self.max_tokens == 0

    @property
    def engine_max_tokens(self) -> Optional[int]:
        """The engine's max_tokens: echo-only requests run their prompt and one step, whose token is dropped."""
        return 1 if self.echo_only else self.max_tokens

    @property
    def engine_prompt_logprobs(self) -> Optional[int]:
        """Prompt log-probabilities the engine computes: prompt_logprobs, or logprobs with echo."""
        counts = [k for k in (self.prompt_logprobs, self.logprobs if self.echo else None) if k is not None]
        return max(counts) if counts else None

    def prompts(self) -> list[Union[str, list[int]]]:
        """The prompts as a list of strings and token-id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ApiError(400, "prompt must not be empty", "prompt")
        if isinstance(p[0], int):
            return [p]
        return list(p)


class ContentPart(BaseModel):
    """One part of a message's content; only {"type": "text", "text": ...} is supported."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: Optional[str] = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None  # an earlier answer's reasoning, passed to the template as is
    reasoning: Optional[str] = None  # vLLM's newer name for reasoning_content (the template sees reasoning_content)


class _ToolFields(BaseModel):
    """`tools`, `tool_choice` and `parallel_tool_calls` read through tools.py (chat completions and
    responses): a subclass gives them in chat completions' form (`chat_tools`, `chat_tool_choice`)."""

    _tool_parser: Optional[str] = PrivateAttr(None)  # the server's --tool-call-parser (`use_tool_parser`)

    def chat_tools(self) -> Optional[list]:
        return self.tools

    def chat_tool_choice(self) -> Any:
        return self.tool_choice

    def use_tool_parser(self, parser: Optional[str]) -> None:
        """The server's parser of free-form tool calls (tool_choice "auto"), None for none."""
        self._tool_parser = parser

    @property
    def functions_given(self) -> list[dict]:
        """The function definitions of `tools` (400s name the field)."""
        from .tools import check_tools

        return check_tools(self.chat_tools())

    @property
    def tool_call(self) -> Optional[str]:
        """The resolved tool_choice: None (a text answer), "required", "auto" (read by the server's
        tool-call parser) or the function's name."""
        from .tools import resolve_choice

        return resolve_choice(self.chat_tool_choice(), self.functions_given, self._tool_parser)

    def tool_constraint(self) -> Optional[dict]:
        """GuidedDecoding arguments the tool choice sets, if any."""
        from .tools import constraint

        return constraint(self.tool_call, self.functions_given, self.parallel_tool_calls is not False)

    def rendered_tools(self) -> list[dict]:
        """The tools as the chat template takes them."""
        return [{"type": "function", "function": fn} for fn in self.functions_given]


class ChatCompletionRequest(_ToolFields, _SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1, description="null: up to the end of the context")
    max_tokens: Optional[int] = Field(None, ge=1, description="deprecated alias of max_completion_tokens")
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = Field(None, description="false: tool_choice 'required' makes one call")
    functions: Optional[list[dict[str, Any]]] = None
    function_call: Optional[Union[str, dict[str, Any]]] = None
    add_generation_prompt: Optional[bool] = Field(
        True, description="vLLM: end the prompt with the template's assistant header (the answer starts a new message)")
    continue_final_message: Optional[bool] = Field(
        False, description="vLLM: leave the last message open so the answer continues it (not with "
                           "add_generation_prompt)")
    chat_template_kwargs: Optional[dict[str, Any]] = Field(
        None, description="vLLM: extra variables for the chat template (e.g. enable_thinking)")
    chat_template: Optional[str] = Field(
        None, description="vLLM: a Jinja chat template for this request (needs rlt-serve --trust-request-chat-template)")
    documents: Optional[list[dict[str, str]]] = Field(
        None, description="vLLM: documents for retrieval-augmented templates ({'title': ..., 'text': ...} each)")
    add_special_tokens: Optional[bool] = Field(False, description="vLLM: add the tokenizer's special tokens (e.g. BOS) "
                                               "to the rendered chat prompt")
    include_reasoning: Optional[bool] = Field(
        True, description="vLLM: false leaves the reasoning out of the answer (no reasoning_content)")
    echo: Optional[bool] = Field(
        False, description="vLLM: the answer starts with the last message's content when that message is the "
                           "assistant's (continue_final_message)")

    _NULL_DEFAULTS: ClassVar[dict] = {**_SamplingFields._NULL_DEFAULTS, "logprobs": False,
                                      "add_generation_prompt": True, "continue_final_message": False,
                                      "add_special_tokens": False, "include_reasoning": True, "echo": False}

    def check_neutral(self) -> None:
        super().check_neutral()
        if self.functions:
            raise unsupported("functions", "null or [] (send tools)")
        if self.function_call not in (None, "none", "auto"):
            raise unsupported("function_call", "null, 'none' or 'auto' without functions")
        if self.prompt_logprobs is not None and self.stream:
            raise ApiError(400, "prompt_logprobs is not supported with stream in chat completions", "prompt_logprobs",
                           "unsupported")
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs to be true", "top_logprobs")
        if (self.max_tokens is not None and self.max_completion_tokens is not None
                and self.max_tokens != self.max_completion_tokens):
            raise ApiError(400, "max_tokens and max_completion_tokens disagree; give one", "max_tokens")

    @property
    def output_limit(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def echoed(self) -> str:
        """What `echo` puts before every answer: the last message's text when it is the assistant's
        (the answer continues it), else nothing."""
        last = self.messages[-1]
        if not self.echo or last.role != "assistant":
            return ""
        return template_messages([last])[0]["content"]

    @property
    def logprobs_count(self) -> Optional[int]:
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self) -> list[dict]:
        return template_messages(self.messages)

    def guided_fields(self) -> list[tuple[str, dict]]:
        tool = self.tool_constraint()
        return super().guided_fields() + ([("tool_choice", tool)] if tool is not None else [])


RESPONSE_FORMAT_KEYS = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"},
                        "structural_tag": {"type", "structures", "triggers", "format"}}


def response_format_constraint(rf: Optional[dict]) -> Optional[dict]:
    """GuidedDecoding arguments of a `response_format` (None for none or type text; 400s naming
    response_format): json_object, json_schema (no schema: any JSON object, as vLLM does) or
    vLLM's structural_tag (`{"structures": [...], "triggers": [...]}` or xgrammar's
    `{"format": {...}}`, checked by GuidedDecoding)."""
    if rf is None:
        return None
    kind = rf.get("type")
    if kind not in RESPONSE_FORMAT_KEYS:
        raise ApiError(400, f"response_format.type must be one of {sorted(RESPONSE_FORMAT_KEYS)}, got {kind!r}",
                       "response_format", "invalid_value")
    extra = sorted(set(rf) - RESPONSE_FORMAT_KEYS[kind])
    if extra:
        raise ApiError(400, f"response_format of type {kind!r} takes no {extra}", "response_format", "invalid_value")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "structural_tag":
        return {"structural_tag": dict(rf)}
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise ApiError(400, "response_format.json_schema must be an object with a 'schema' object (and 'name', "
                       "'description', 'strict')", "response_format", "invalid_value")
    unknown = sorted(set(spec) - {"name", "description", "schema", "strict"})
    if unknown:
        raise ApiError(400, f"response_format.json_schema has unknown keys {unknown}", "response_format",
                       "invalid_value")
    return {"json": spec["schema"]} if spec.get("schema") else {"json_object": True}


# vLLM's StructuredOutputsParams options that change nothing here: JSON is always written on one
# line with fixed separators, objects take only the schema's properties (xgrammar's strict mode),
# and xgrammar is the only backend (nothing to fall back from).
STRUCTURED_OUTPUT_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "disable_fallback")


def structured_outputs_constraint(so: Optional[dict]) -> Optional[dict]:
    """GuidedDecoding arguments of vLLM's `structured_outputs` (None when it sets no constraint; a
    400 naming structured_outputs for unknown keys or options of the wrong type; GuidedDecoding
    checks that one constraint is given, and its value)."""
    if so is None:
        return None
    allowed = set(GUIDED_KINDS) | set(STRUCTURED_OUTPUT_OPTIONS) | {"whitespace_pattern"}
    unknown = sorted(set(so) - allowed)
    if unknown:
        raise ApiError(400, f"structured_outputs has unknown keys {unknown} (allowed: {sorted(allowed)})",
                       "structured_outputs", "invalid_value")
    for name in STRUCTURED_OUTPUT_OPTIONS:
        if so.get(name) is not None and not isinstance(so[name], bool):
            raise ApiError(400, f"structured_outputs.{name} must be a boolean, got {so[name]!r}", "structured_outputs",
                           "invalid_value")
    if so.get("whitespace_pattern") is not None:
        raise ApiError(400, "structured_outputs.whitespace_pattern is not supported by this server (only null is "
                       "accepted: JSON is written on one line with fixed separators)", "structured_outputs",
                       "unsupported")
    given = {k: so[k] for k in GUIDED_KINDS if so.get(k) is not None and so.get(k) is not False}
    return given or None


def template_messages(messages: list[ChatMessage]) -> list[dict]:
    """The messages as the chat template takes them (`chat_messages.template_messages`; a 400 naming
    the message field)."""
    try:
        return chat_template_messages([m.model_dump(exclude_none=True) for m in messages])
    except MessageError as exc:
        raise ApiError(400, str(exc), exc.field, exc.code) from None


class TokenizeRequest(_ToolFields, _Strict):
    """POST /tokenize: either `prompt` or chat `messages` (rendered with the chat template, with
    `tools` as chat completions render them)."""

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
    chat_template: Optional[str] = None
    documents: Optional[list[dict[str, str]]] = None
    tools: Optional[list[dict[str, Any]]] = None


class DetokenizeRequest(_Strict):
    """POST /detokenize."""

    model: Optional[str] = None
    tokens: list[TokenId]


# ---- responses ---------------------------------------------------------------------------------

class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens whose K/V came from the prefix cache


class Usage(BaseModel):
    """Token counts; the final usage also says how many prompt tokens the prefix cache served
    (`prompt_tokens_details.cached_tokens`, as OpenAI reports it); per-chunk usage leaves it null."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: Optional[PromptTokensDetails] = None


class CompletionLogprobs(BaseModel):
    """OpenAI completions logprobs: parallel lists, one entry per token (with echo the prompt's
    first, whose first token has null log-probabilities: nothing precedes it)."""

    tokens: list[str] = []
    token_logprobs: list[Optional[float]] = []
    top_logprobs: list[Optional[dict[str, float]]] = []
    text_offset: list[int] = []


class PromptLogprob(BaseModel):
    """vLLM's entry of a prompt_logprobs dict; rank (1 = most likely) where known."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


PromptLogprobs = list[Optional[dict[str, PromptLogprob]]]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    prompt_logprobs: Optional[PromptLogprobs] = Field(
        None, description="vLLM: per prompt token (null first) its token id -> log-probability and the top N")
    finish_reason: Optional[Literal["stop", "length"]] = None
    stop_reason: Optional[Union[int, str]] = Field(
        None, description="vLLM: the stop string or stop token id that ended the choice (null for EOS and the rest)")
    exit_depths: list[int] = Field(default_factory=list, description="rlt: loops each token of this choice ran")
    prompt_token_ids: Optional[list[int]] = Field(None, description="vLLM (return_token_ids): the prompt's token ids")
    token_ids: Optional[list[int]] = Field(None, description="vLLM (return_token_ids): the choice's generated ids")


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class TokenLogprobOut(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobOut]


class FunctionCallOut(BaseModel):
    name: str
    arguments: str = Field(description="the call's arguments as a JSON string")


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    tool_calls: list[ToolCallOut] = Field(default_factory=list, description="the calls a tool_choice asked for")
    reasoning_content: Optional[str] = Field(
        None, description="the answer's reasoning (between <think> and </think>) when a reasoning parser runs")

    @computed_field
    @property
    def reasoning(self) -> Optional[str]:
        """The same text under vLLM's newer name."""
        return self.reasoning_content


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Literal["stop", "length", "tool_calls"]
    stop_reason: Optional[Union[int, str]] = Field(
        None, description="vLLM: the stop string or stop token id that ended the choice (null for EOS and the rest)")
    exit_depths: list[int] = Field(default_factory=list, description="rlt: loops each token of this choice ran")
    token_ids: Optional[list[int]] = Field(None, description="vLLM (return_token_ids): the choice's generated ids")


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: Optional[PromptLogprobs] = Field(None, description="vLLM: as in completions choices")
    prompt_token_ids: Optional[list[int]] = Field(None, description="vLLM (return_token_ids): the prompt's token ids")


class ChatDelta(BaseModel):
    """A streamed message delta; unset fields are left out of the JSON (as OpenAI sends them)."""

    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None  # OpenAI's tool call deltas ({"index", "id", "function"})

    @model_serializer
    def _without_nulls(self) -> dict:
        fields = (("role", self.role), ("content", self.content), ("reasoning_content", self.reasoning_content),
                  ("reasoning", self.reasoning_content),  # vLLM's newer name for the same text
                  ("tool_calls", self.tool_calls))
        return {k: v for k, v in fields if v is not None}


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[Literal["stop", "length", "tool_calls"]] = None
    stop_reason: Optional[Union[int, str]] = Field(
        None, description="vLLM: the stop string or stop token id that ended the choice (null for EOS and the rest)")
    exit_depths: list[int] = Field(default_factory=list, description="rlt: loops each token of this choice ran")
    token_ids: Optional[list[int]] = Field(None, description="vLLM (return_token_ids): the chunk's new token ids")


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None
    prompt_token_ids: Optional[list[int]] = Field(
        None, description="vLLM (return_token_ids): the prompt's token ids, in each choice's first chunk")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "rlt"
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


# ---- helpers -----------------------------------------------------------------------------------

_UNION_HINTS = {
    "prompt": "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists",
    "trace_id": "trace_id must be a non-empty string or a list of non-empty strings (one per prompt)",
    "stop": "stop must be a non-empty string or a list of non-empty strings",
}
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after", "function-before"}


def _param(loc: tuple) -> str:
    """`loc` of a pydantic error as a field path ("messages[0].content"), union tags dropped."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            if not parts:
                break
            parts[-1] += f"[{item}]"
        elif item.isidentifier() and item not in _TYPE_TAGS:
            parts.append(item)
        else:
            break
    return ".".join(parts)


def _loc(error: dict) -> tuple:
    loc = tuple(error.get("loc", ()))
    return loc[1:] if loc[:1] == ("body",) else loc


def validation_error(errors: list[dict]) -> ApiError:
    """A 400 ApiError from FastAPI/pydantic validation errors, naming the first offending field."""
    first = errors[0]
    kind, loc = first.get("type"), _loc(first)
    if not loc:
        return ApiError(400, "the request body must be a JSON object", None, "invalid_body")
    param = _param(loc) or None
    if kind == "extra_forbidden":
        return ApiError(400, f"unknown field {param!r} (this server rejects fields it does not know)", param,
                        "unknown_field")
    if kind == "missing":
        return ApiError(400, f"{param} is required", param, "missing_field")
    if param in _UNION_HINTS and sum(_param(_loc(e)) == param for e in errors) > 1:
        return ApiError(400, _UNION_HINTS[param], param, "invalid_type")
    value = first.get("input")
    shown = json.dumps(value)[:80] if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__
    return ApiError(400, f"{param}: {first.get('msg', 'invalid value')} (got {shown})", param, "invalid_value")


def sse(payload: Union[BaseModel, dict, str]) -> bytes:
    """One server-sent event: `data: <json>\\n\\n` (or `data: [DONE]\\n\\n`)."""
    if isinstance(payload, str):
        data = payload
    elif isinstance(payload, BaseModel):
        data = payload.model_dump_json()
    else:
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + data.encode("utf-8") + b"\n\n"


def param_from_message(message: str) -> Optional[str]:
    """The request field an engine/SamplingParams error message starts with (or a part of one:
    `repetition_detection.min_count`), if any."""
    word = message.split(" ", 1)[0].strip(":,")
    fields = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    return word if word.split(".")[0] in fields else None
