"""Generation results returned by `LLM.generate` and the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class TokenLogprob:
    """Raw log-probability of the chosen token and the top-N alternatives (token id -> logprob)."""

    logprob: float
    top: dict[int, float] = field(default_factory=dict)


@dataclass
class CompletionOutput:
    """One generated sequence. ``exit_depths`` has one entry per generated token: the loops run."""

    index: int
    text: str
    token_ids: list[int]
    exit_depths: list[int]
    finish_reason: Optional[str]  # "stop" | "length" | "abort" | "error" | None while running
    logprobs: Optional[list[TokenLogprob]] = None
    stop_reason: Optional[object] = None  # the stop string or token id that ended generation
    cumulative_logprob: Optional[float] = None  # sum of the tokens' raw logprobs (with logprobs or best_of > n)


@dataclass
class RequestMetrics:
    """Wall-clock times (time.monotonic seconds) and work counters of one request."""

    arrival_time: float
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    finished_time: Optional[float] = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    loops_executed: int = 0
    num_preemptions: int = 0


@dataclass
class RequestOutput:
    """All samples of one prompt. ``finished`` is True once every sample has ended.

    ``prompt_logprobs`` (requested with SamplingParams.prompt_logprobs): one entry per prompt
    token, None for the first, then the token's log-probability given the tokens before it and
    the top-N alternatives at its position.

    ``error`` is set when the request ended because the engine replica running it failed (with
    data_parallel_size > 1); its unfinished samples then have finish_reason "error"."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: Optional[RequestMetrics] = None
    prompt_logprobs: Optional[list[Optional[TokenLogprob]]] = None
    error: Optional[str] = None
