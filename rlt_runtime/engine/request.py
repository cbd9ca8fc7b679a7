"""Request: the scheduler-side state of one generated sequence (plain Python, no torch)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

from ..outputs import RequestMetrics, TokenLogprob
from ..sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One sequence (a prompt with n samples becomes n Requests sharing a group id).

    Positions: the sequence is prompt + outputs. ``num_computed`` tokens have their K/V in the
    cache. A running request with ``num_computed == num_tokens - 1`` is decoding: its last token
    is the pending input of the next decode step. While prefilling, ``num_computed`` <
    ``prefill_target`` (the prompt, or after a preemption the prompt plus all outputs but the last).
    ``generation`` increases on preemption and abort, so results of older submissions are ignored.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_index: int
    row_key: int
    max_tokens: int
    depth_limit: int  # D_max for this request's decode tokens
    min_loops: int
    group_id: str = ""
    sample_index: int = 0
    prompt: Optional[str] = None
    trace_depths: Optional[list[int]] = None
    status: Status = Status.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    exit_depths: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # of prompt tokens 1, 2, ... so far
    num_computed: int = 0
    num_inflight: int = 0  # tokens submitted to the device whose results have not arrived
    inflight_outputs: int = 0  # output tokens those submissions will produce
    slot: Optional[int] = None
    generation: int = 0
    bypass_count: int = 0
    finish_reason: Optional[str] = None
    stop_reason: object = None
    metrics: RequestMetrics = None  # set by the engine
    swapped: object = None  # CPU copy of the K/V while swapped out (swap preemption)
    prompt_block_hashes: Optional[list[int]] = None  # set by the scheduler on first use
    draft: object = None  # DraftState of a speculative request (its own history decides its draft counts)
    min_token_stops: list[int] = field(default_factory=list)  # ids banned until min_tokens outputs exist
    bad_word_ids: list[list[int]] = field(default_factory=list)  # the request's bad words as token ids
    cumulative_logprob: float = 0.0  # sum of the committed tokens' raw log-probabilities (best_of ranking)
    matcher: object = None  # xgrammar GrammarMatcher of a guided request (advanced by committed tokens only)
    allowed_words: object = None  # a guided request's allowed_token_ids: int32 [ceil(vocab / 32)] mask row
    num_sent: int = 0  # output entries already handed out in delta outputs
    num_prompt_logprobs_sent: int = 0  # prompt log-probability entries (the first None included) handed out

    # The two flags below read only the request's params and matcher, fixed at construction:
    # computed on first use and kept (the engine reads them for every row of every step).
    @cached_property
    def processes_logits(self) -> bool:
        """Whether steps process this sequence's logits (logit processing or a guided-decoding mask)."""
        return self.params.processes_logits or self.matcher is not None

    @cached_property
    def wants_logprobs(self) -> bool:
        """Whether steps compute this sequence's log-probabilities (asked for, or ranking best_of)."""
        return self.params.logprobs is not None or self.params.num_samples > self.params.n

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def prefill_target(self) -> int:
        """Tokens that must be in the cache before decoding (re)starts."""
        outputs = len(self.output_token_ids)
        return len(self.prompt_token_ids) + outputs - 1 if outputs else len(self.prompt_token_ids)

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Whether this sequence still computes prompt log-probabilities (the first sample of a
        request that asked for them, until every prompt token after the first has one)."""
        return (self.params.prompt_logprobs is not None and self.sample_index == 0
                and len(self.prompt_logprobs) < self.num_prompt_tokens - 1)

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed + self.num_inflight < self.prefill_target

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def tokens_in(self, start: int, end: int) -> list[int]:
        """Token ids at positions [start, end): prompt tokens, then outputs."""
        p = self.num_prompt_tokens
        return self.prompt_token_ids[start:min(end, p)] + self.output_token_ids[max(start - p, 0):max(end - p, 0)]

    def depths_in(self, start: int, end: int, full_depth: int) -> list[int]:
        """Loops the tokens at positions [start, end) run: full depth for the prompt, the recorded
        depth for outputs being recomputed after preemption (output j ran exit_depths[j + 1] loops)."""
        p = self.num_prompt_tokens
        return [full_depth] * max(min(end, p) - start, 0) + self.exit_depths[max(start - p, 0) + 1:max(end - p, 0) + 1]

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids
