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


class OutputAccumulator:
    """The cumulative output of one request, rebuilt from its delta outputs (`step(deltas=True)`).

    `add(delta)` appends each sample's new token ids, exit depths and log-probabilities to lists
    kept in place and its new text as one more piece: O(new entries), however long the request
    has run. `output` is a RequestOutput whose lists are those growing lists; each sample's `text`
    is joined from its pieces once, when the request finishes (`text_since` reads the new text
    before that). Samples appear in `output.outputs` in the order their first delta names them.
    """

    def __init__(self):
        self.output: Optional[RequestOutput] = None
        self._pieces: dict[int, list[str]] = {}  # sample index -> text pieces
        self._samples: dict[int, CompletionOutput] = {}

    @property
    def finished(self) -> bool:
        return self.output is not None and self.output.finished

    def add(self, delta: RequestOutput) -> None:
        out = self.output
        if out is None:
            out = self.output = RequestOutput(delta.request_id, delta.prompt, delta.prompt_token_ids, [], False,
                                              metrics=delta.metrics, prompt_logprobs=None)
        for c in delta.outputs:
            mine = self._samples.get(c.index)
            if mine is None:
                mine = self._samples[c.index] = CompletionOutput(
                    c.index, "", [], [], None, logprobs=None if c.logprobs is None else [])
                self._pieces[c.index] = []
                out.outputs.append(mine)
            mine.token_ids += c.token_ids
            mine.exit_depths += c.exit_depths
            if c.logprobs is not None:
                mine.logprobs += c.logprobs
            if c.text:
                self._pieces[c.index].append(c.text)
            mine.finish_reason, mine.stop_reason = c.finish_reason, c.stop_reason
            mine.cumulative_logprob = c.cumulative_logprob
        if delta.prompt_logprobs is not None:
            if out.prompt_logprobs is None:
                out.prompt_logprobs = []
            out.prompt_logprobs += delta.prompt_logprobs
        out.metrics = delta.metrics
        out.error = delta.error
        if delta.finished:
            out.finished = True
            for index, mine in self._samples.items():
                mine.text = "".join(self._pieces[index])

    def text_since(self, index: int, cursor: int) -> tuple[str, int]:
        """Sample `index`'s text added after `cursor` (0 at first), and the cursor to pass next."""
        pieces = self._pieces.get(index, ())
        return "".join(pieces[cursor:]), len(pieces)
