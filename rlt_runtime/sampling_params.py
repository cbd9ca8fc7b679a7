"""SamplingParams: per-request sampling and loop controls, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Union

from .engine.stop_matcher import StopAutomaton
from .errors import ConfigError
from .guided_decoding import GuidedDecoding

MAX_LOGPROBS = 20
MAX_INT32 = 2**31 - 1  # top_k travels to the device as int32 (values past the vocabulary mean "off")
MAX_SAMPLES = 64  # n and best_of
MAX_LOGIT_BIAS = 300  # logit_bias entries per request (the device keeps a fixed-width list per slot)
MAX_LOGIT_BIAS_VALUE = 100.0
MAX_BAD_WORDS = 32  # bad word token sequences per request, after tokenization (with and without a leading space)
MAX_BAD_WORD_TOKENS = 8  # tokens per bad word
MAX_REPETITION_PATTERN = 1024  # repetition_detection's pattern sizes and counts


def _check(cond: bool, name: str, allowed: str, value) -> None:
    if not cond:
        raise ConfigError(f"{name} must be {allowed}, got {value!r}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    """An int or float, not a bool (True is an int in Python, never a probability)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class RepetitionDetectionParams:
    """vLLM's: a request stops ("stop", stop_reason "repetition_detected") once its output ends
    with a pattern of min_pattern_size..max_pattern_size tokens written min_count times in a row.
    max_pattern_size 0 disables it; min_pattern_size 0 means 1."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self):
        for name in ("max_pattern_size", "min_pattern_size", "min_count"):
            value = getattr(self, name)
            _check(_is_int(value) and 0 <= value <= MAX_REPETITION_PATTERN, f"repetition_detection.{name}",
                   f"an integer in 0..{MAX_REPETITION_PATTERN}", value)
        _check(self.min_pattern_size <= self.max_pattern_size, "repetition_detection.min_pattern_size",
               f"at most max_pattern_size ({self.max_pattern_size})", self.min_pattern_size)
        _check(self.max_pattern_size == 0 or self.min_count >= 2, "repetition_detection.min_count",
               "at least 2 when max_pattern_size is set", self.min_count)

    def repeats(self, tokens: list[int]) -> bool:
        """Whether `tokens` end with a pattern of an allowed size written min_count times in a row."""
        for size in range(max(self.min_pattern_size, 1), self.max_pattern_size + 1):
            span = size * self.min_count
            if len(tokens) < span:
                break
            tail = tokens[-size:]
            if all(tokens[len(tokens) - (i + 1) * size:len(tokens) - i * size] == tail for i in range(1, self.min_count)):
                return True
        return False


@dataclass
class SamplingParams:
    """How to sample one request (vLLM-shaped) plus the loop controls of looped models.

    temperature 0 means greedy. top_k <= 0 and top_p = 1 and min_p = 0 disable those filters.
    ``seed`` makes the request's samples reproducible regardless of its batch neighbours.
    ``stop`` strings end generation and are not included in the text; ``stop_token_ids`` and EOS
    (unless ``ignore_eos``) end it with the token included in ``token_ids`` but not in the text.
    ``logprobs`` = N returns the chosen token's log-probability and the top-N alternatives.
    ``prompt_logprobs`` = N returns, in ``RequestOutput.prompt_logprobs``, the log-probability of
    every prompt token given the tokens before it and the top-N alternatives at that position
    (None for the first token, which has no context). A request that asks for them computes its
    whole prompt (no prefix-cache hit skips positions).
    ``skip_special_tokens`` = False keeps special tokens in the output text;
    ``include_stop_str_in_output`` = True keeps the matched stop string at the end of the text.
    ``min_loops`` / ``max_loops`` bound the loops a generated token may run (prompts always run
    the full depth); ``exit_threshold`` < 1 enables the exit policy's adaptive exit (1 = fixed).
    ``speculative`` = False opts this request out of speculative decoding.

    Logit processing (vLLM's semantics, applied on the device in this order before temperature
    and the filters): ``logit_bias`` {token id: bias in [-100, 100]} is added to the logits;
    until ``min_tokens`` tokens exist, EOS (unless ``ignore_eos``) and ``stop_token_ids`` are
    banned (and ``stop`` strings ending in those tokens' text do not count); ``bad_words`` (strings, tokenized with and without a leading space, or token-id
    lists) ban a word's last token whenever the output ends with its other tokens; then
    ``repetition_penalty`` divides positive logits and multiplies negative ones of every token in
    the prompt or the output, and ``frequency_penalty`` * count + ``presence_penalty`` * (count >
    0) is subtracted, counting output tokens only. Reported logprobs stay those of the raw model.
    ``best_of`` > n generates best_of samples and returns the n with the highest cumulative
    log-probability (raw, of the tokens chosen).
    ``guided`` constrains the output to a JSON schema, any JSON object, a regex, one of a list of
    strings, an EBNF grammar or a structural tag (a `GuidedDecoding`, or a dict of its fields such
    as ``{"json": schema}``, ``{"regex": "[0-9]+"}``, ``{"choice": ["yes", "no"]}``; needs the
    `xgrammar` package): tokens the grammar cannot take next are masked on the device before
    sampling, EOS is allowed exactly when the grammar can end, and generation stops when it has
    ended. Under speculation guided requests draft; their drafts are checked against the grammar
    on the host and every verified position is masked by it.
    ``allowed_token_ids`` (vLLM's) restricts sampling to those token ids: every other token is
    masked on the device with the guided-decoding masks (a grammar's mask and this one both hold).
    ``truncate_prompt_tokens`` = k keeps the last k prompt tokens (the first k with
    ``truncation_side`` "right"); -1 keeps as many as the context takes with room for one output
    token (max_model_len - 1). ``RequestOutput.prompt`` is then the kept tokens' text.
    ``thinking_token_budget`` (vLLM's) ends the reasoning after that many tokens: once the text
    after the last open ``<think>`` (in the prompt or the output) holds them, the next tokens are
    forced to ``</think>`` (engine/thinking_budget.py); None or -1: no limit.
    ``repetition_detection`` (vLLM's, a `RepetitionDetectionParams` or a dict of its fields) stops
    the request when its output ends in a short pattern repeated enough times.
    ``trace_id`` keys this request in exit traces: the entry replayed with exit_mode="trace" and
    the key `record_exit_trace` writes (default: the request id).
    """

    n: int = 1
    max_tokens: Optional[int] = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    min_loops: Optional[int] = None
    max_loops: Optional[int] = None
    exit_threshold: float = 1.0
    priority: int = 0
    speculative: bool = True
    trace_id: Optional[str] = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Optional[dict[int, float]] = None
    min_tokens: int = 0
    bad_words: Optional[list[Union[str, list[int]]]] = None
    best_of: Optional[int] = None
    guided: Optional[Union[GuidedDecoding, dict]] = None
    allowed_token_ids: Optional[list[int]] = None
    truncate_prompt_tokens: Optional[int] = None
    truncation_side: str = "left"
    thinking_token_budget: Optional[int] = None
    repetition_detection: Optional[Union[RepetitionDetectionParams, dict]] = None
    stop_list: list[str] = field(init=False, repr=False, default_factory=list)
    _stop_automaton: Optional[StopAutomaton] = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self):
        _check(_is_int(self.n) and 1 <= self.n <= MAX_SAMPLES, "n", f"an integer in 1..{MAX_SAMPLES}", self.n)
        _check(self.best_of is None or (_is_int(self.best_of) and self.n <= self.best_of <= MAX_SAMPLES), "best_of",
               f"None or an integer in n..{MAX_SAMPLES} (n = {self.n})", self.best_of)
        _check(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
               "max_tokens", "a positive integer or None", self.max_tokens)
        _check(_is_number(self.temperature) and 0.0 <= self.temperature <= 100.0, "temperature", "a number in [0, 100]", self.temperature)
        _check(_is_number(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", "a number in (0, 1]", self.top_p)
        _check(_is_int(self.top_k) and (self.top_k == -1 or 1 <= self.top_k <= MAX_INT32), "top_k",
               f"-1 (off) or an integer in 1..{MAX_INT32}", self.top_k)
        _check(_is_number(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p", "a number in [0, 1]", self.min_p)
        _check(self.seed is None or (_is_int(self.seed) and 0 <= self.seed < 2**63), "seed", "None or an integer in [0, 2**63)", self.seed)
        if isinstance(self.stop, str):
            self.stop_list = [self.stop]
        elif self.stop is None:
            self.stop_list = []
        else:
            _check(isinstance(self.stop, (list, tuple)) and all(isinstance(s, str) and s for s in self.stop),
                   "stop", "a non-empty string or a list of non-empty strings", self.stop)
            self.stop_list = list(self.stop)
        _check(all(s for s in self.stop_list), "stop", "non-empty strings", self.stop)
        if self.stop_token_ids is not None:
            _check(isinstance(self.stop_token_ids, (list, tuple)) and all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
                   "stop_token_ids", "a list of non-negative integers", self.stop_token_ids)
            self.stop_token_ids = list(self.stop_token_ids)
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", "a boolean", self.ignore_eos)
        _check(self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
               "logprobs", f"None or an integer in 0..{MAX_LOGPROBS}", self.logprobs)
        _check(self.prompt_logprobs is None or (_is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
               "prompt_logprobs", f"None or an integer in 0..{MAX_LOGPROBS}", self.prompt_logprobs)
        _check(isinstance(self.skip_special_tokens, bool), "skip_special_tokens", "a boolean", self.skip_special_tokens)
        _check(isinstance(self.include_stop_str_in_output, bool), "include_stop_str_in_output", "a boolean",
               self.include_stop_str_in_output)
        _check(self.min_loops is None or (_is_int(self.min_loops) and self.min_loops >= 1), "min_loops", "None or an integer >= 1", self.min_loops)
        _check(self.max_loops is None or (_is_int(self.max_loops) and self.max_loops >= 1), "max_loops", "None or an integer >= 1", self.max_loops)
        if self.min_loops is not None and self.max_loops is not None and self.min_loops > self.max_loops:
            raise ConfigError(f"min_loops ({self.min_loops}) must not exceed max_loops ({self.max_loops})")
        _check(_is_number(self.exit_threshold) and 0.0 <= self.exit_threshold <= 1.0, "exit_threshold", "a number in [0, 1]", self.exit_threshold)
        _check(_is_int(self.priority), "priority", "an integer", self.priority)
        _check(isinstance(self.speculative, bool), "speculative", "a boolean", self.speculative)
        self._check_processing()
        if self.guided is not None:
            self.guided = GuidedDecoding.from_value(self.guided)
        _check(self.truncate_prompt_tokens is None or (_is_int(self.truncate_prompt_tokens) and (
            self.truncate_prompt_tokens == -1 or 1 <= self.truncate_prompt_tokens <= MAX_INT32)),
            "truncate_prompt_tokens", f"None, -1 (as many as the context takes) or an integer in 1..{MAX_INT32}",
            self.truncate_prompt_tokens)
        _check(self.truncation_side in ("left", "right"), "truncation_side", "'left' (keep the last tokens) or 'right'",
               self.truncation_side)
        _check(self.thinking_token_budget is None or (_is_int(self.thinking_token_budget) and (
            -1 <= self.thinking_token_budget <= MAX_INT32)), "thinking_token_budget",
            f"None, -1 (no limit) or an integer in 0..{MAX_INT32}", self.thinking_token_budget)
        if self.thinking_token_budget == -1:
            self.thinking_token_budget = None
        if isinstance(self.repetition_detection, dict):
            unknown = sorted(set(self.repetition_detection) - {"max_pattern_size", "min_pattern_size", "min_count"})
            _check(not unknown, "repetition_detection", "a dict of max_pattern_size, min_pattern_size and min_count",
                   self.repetition_detection)
            self.repetition_detection = RepetitionDetectionParams(**self.repetition_detection)
        _check(self.repetition_detection is None or isinstance(self.repetition_detection, RepetitionDetectionParams),
               "repetition_detection", "None, a RepetitionDetectionParams or a dict of its fields",
               self.repetition_detection)
        if self.repetition_detection is not None and self.repetition_detection.max_pattern_size == 0:
            self.repetition_detection = None  # (disabled)
        _check(self.trace_id is None or (isinstance(self.trace_id, str) and self.trace_id != ""), "trace_id",
               "None or a non-empty string", self.trace_id)

    def _check_processing(self) -> None:
        finite = lambda x: _is_number(x) and math.isfinite(x)  # noqa: E731
        _check(finite(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 100.0, "repetition_penalty",
               "a number in (0, 100] (1 = off)", self.repetition_penalty)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(finite(value) and -2.0 <= value <= 2.0, name, "a number in [-2, 2] (0 = off)", value)
        if self.logit_bias is not None:
            _check(isinstance(self.logit_bias, dict) and len(self.logit_bias) <= MAX_LOGIT_BIAS, "logit_bias",
                   f"None or a dict of at most {MAX_LOGIT_BIAS} entries", self.logit_bias)
            for token, bias in self.logit_bias.items():
                _check(_is_int(token) and 0 <= token <= MAX_INT32, "logit_bias", "keyed by non-negative token ids",
                       token)
                _check(finite(bias) and abs(bias) <= MAX_LOGIT_BIAS_VALUE, "logit_bias",
                       f"valued in [-{MAX_LOGIT_BIAS_VALUE:g}, {MAX_LOGIT_BIAS_VALUE:g}]", bias)
            self.logit_bias = {int(t): float(b) for t, b in self.logit_bias.items()}
        _check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "a non-negative integer", self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ConfigError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.bad_words is not None:
            ok = isinstance(self.bad_words, (list, tuple)) and all(
                (isinstance(w, str) and w.strip()) or (isinstance(w, (list, tuple)) and w and all(_is_int(t) and t >= 0 for t in w))
                for w in self.bad_words)
            _check(ok, "bad_words", "a list of non-blank strings or non-empty token-id lists", self.bad_words)
            self.bad_words = [w if isinstance(w, str) else list(w) for w in self.bad_words]
        if self.allowed_token_ids is not None:
            _check(isinstance(self.allowed_token_ids, (list, tuple)) and self.allowed_token_ids
                   and all(_is_int(t) and 0 <= t <= MAX_INT32 for t in self.allowed_token_ids),
                   "allowed_token_ids", "None or a non-empty list of token ids", self.allowed_token_ids)
            self.allowed_token_ids = list(self.allowed_token_ids)

    @property
    def num_samples(self) -> int:
        """Sequences generated: best_of when given, else n."""
        return self.best_of or self.n

    @property
    def processes_logits(self) -> bool:
        """Whether any logit processing applies (bias, min_tokens, bad words, penalties, allowed tokens)."""
        return bool(self.repetition_penalty != 1.0 or self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.min_tokens or self.bad_words or self.allowed_token_ids)

    def truncated(self, ids: list[int], max_model_len: int) -> list[int]:
        """The prompt token ids the request keeps (``truncate_prompt_tokens``, ``truncation_side``)."""
        keep = self.truncate_prompt_tokens
        if keep == -1:
            keep = max_model_len - 1
        if keep is None or len(ids) <= keep:
            return ids
        return ids[-keep:] if self.truncation_side == "left" else ids[:keep]

    def stop_automaton(self) -> StopAutomaton:
        """The matcher automaton of `stop_list`, built on first use and kept: every prompt and
        sample of a request given this SamplingParams shares one."""
        if self._stop_automaton is None:
            self._stop_automaton = StopAutomaton(self.stop_list)
        return self._stop_automaton

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
