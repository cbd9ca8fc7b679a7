"""Beam search over the engine (vLLM's `LLM.beam_search` and `use_beam_search`).

A search keeps `beam_width` live beams. Each round, every live beam runs as a one-token greedy
request asking for the top 2 x beam_width raw log-probabilities; every (beam, candidate token)
pair is a new beam with the summed log-probability. A candidate that is an end-of-sequence token
(unless `ignore_eos`) completes its beam; the best `beam_width` of the others (by summed
log-probability) are the next round's live beams. After `max_tokens` rounds (or when no live
beam is left, or the context is full) the completed and live beams are ranked by
`cum_logprob / generated_tokens ** length_penalty` (the end-of-sequence token not counted) and the
best `beam_width` returned. Ties fall to the earlier beam, then the lower token id, so a search is
reproducible; each round's requests run through the scheduler with the others (prefix caching
shares the beams' common blocks).

`BeamSearch` holds one prompt's state; a driver (`LLM.beam_search`, the server) submits each
`next_round` of its searches with `round_params()` and hands the outputs to `take_round`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

from .errors import ConfigError
from .outputs import CompletionOutput, RequestOutput, TokenLogprob
from .sampling_params import MAX_LOGPROBS, SamplingParams

MAX_BEAM_WIDTH = MAX_LOGPROBS // 2  # each round asks for 2 x beam_width log-probabilities


@dataclass
class BeamSearchParams:
    """vLLM's beam-search parameters. temperature and include_stop_str_in_output are accepted for
    vLLM's signature and change nothing: beams are ranked by the raw log-probabilities, and they
    end on end-of-sequence tokens only. stop_token_ids (rlt's) end beams as the
    end-of-sequence tokens do (the server passes a chat template's end-of-turn tokens)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    stop_token_ids: tuple = ()

    def __post_init__(self):
        def check(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise ConfigError(f"{name} must be {allowed}, got {getattr(self, name)!r}")

        is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
        check(is_int(self.beam_width) and 1 <= self.beam_width <= MAX_BEAM_WIDTH, "beam_width",
              f"an integer in 1..{MAX_BEAM_WIDTH}")
        check(is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "a positive integer")
        check(isinstance(self.ignore_eos, bool), "ignore_eos", "a boolean")
        number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
        check(number(self.temperature) and self.temperature >= 0, "temperature", "a number >= 0")
        check(number(self.length_penalty), "length_penalty", "a finite number")


@dataclass
class BeamSearchSequence:
    """A beam: `tokens` holds the prompt's and the generated ids (vLLM's form); `logprobs` one
    TokenLogprob per generated token (its raw log-probability and the round's top candidates)."""

    tokens: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)
    exit_depths: list[int] = field(default_factory=list)  # loops each generated token ran
    cum_logprob: float = 0.0
    text: Optional[str] = None
    finish_reason: Optional[str] = None  # "stop" (end of sequence) or "length"


@dataclass
class BeamSearchOutput:
    """The best `beam_width` beams of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def next_round(searches: list["BeamSearch"]) -> tuple[list[list[list[int]]], list[list[int]]]:
    """(each search's pending beams, all of them in one list: the round's prompts; empty when done)."""
    rounds = [s.pending() for s in searches]
    return rounds, [ids for beams in rounds for ids in beams]


def take_round(searches: list["BeamSearch"], rounds: list, outputs: list[RequestOutput]) -> None:
    """Hand a round's outputs (one per prompt of `next_round`'s list, in order) to their searches."""
    outs = iter(outputs)
    for search, beams in zip(searches, rounds):
        if beams:
            search.advance([next(outs) for _ in beams])


def round_params(params: BeamSearchParams) -> SamplingParams:
    """The SamplingParams of one beam's request in a round."""
    return SamplingParams(max_tokens=1, temperature=0.0, logprobs=2 * params.beam_width, ignore_eos=True)


class BeamSearch:
    """One prompt's search (see the module docstring)."""

    def __init__(self, prompt_ids: list[int], params: BeamSearchParams, eos_ids, max_model_len: int):
        self.prompt_len, self.params = len(prompt_ids), params
        self.eos = frozenset(eos_ids) | frozenset(params.stop_token_ids)
        self.max_model_len = max_model_len
        self.beams = [BeamSearchSequence(list(prompt_ids))]
        self.completed: list[BeamSearchSequence] = []
        self.rounds = 0

    @property
    def done(self) -> bool:
        return (not self.beams or self.rounds >= self.params.max_tokens
                or len(self.beams[0].tokens) >= self.max_model_len)

    def pending(self) -> list[list[int]]:
        """The token ids of the live beams, the next round's prompts (none when done)."""
        return [] if self.done else [b.tokens for b in self.beams]

    def advance(self, outputs: list[RequestOutput]) -> None:
        """Take one round's outputs (one per pending beam, in order)."""
        candidates = []
        for order, (beam, out) in enumerate(zip(self.beams, outputs)):
            sample = out.outputs[0]
            top, depth = sample.logprobs[0].top, sample.exit_depths[0]
            for token, logprob in sorted(top.items(), key=lambda kv: (-kv[1], kv[0])):
                candidates.append((beam.cum_logprob + logprob, order, token, logprob, beam, top, depth))
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        live = []
        for cum, _, token, logprob, beam, top, depth in candidates:
            grown = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [TokenLogprob(logprob, dict(top))],
                                       beam.exit_depths + [depth], cum)
            if token in self.eos and not self.params.ignore_eos:
                grown.finish_reason = "stop"
                self.completed.append(grown)
            elif len(live) < self.params.beam_width:
                live.append(grown)
        self.beams = live
        self.rounds += 1

    def result(self, detokenize) -> BeamSearchOutput:
        """The best beam_width beams, best first; `detokenize(ids) -> str` gives their text."""
        for beam in self.beams:
            beam.finish_reason = "length"
        ranked = sorted(self.completed + self.beams, key=self.score, reverse=True)[:self.params.beam_width]
        for beam in ranked:
            beam.text = detokenize(beam.tokens[self.prompt_len:])
        return BeamSearchOutput(ranked)

    def score(self, beam: BeamSearchSequence) -> float:
        """cum_logprob / generated_tokens ** length_penalty (a final end-of-sequence token not counted)."""
        length = len(beam.tokens) - self.prompt_len - (beam.finish_reason == "stop")
        return beam.cum_logprob / max(length, 1) ** self.params.length_penalty


def request_output(result: BeamSearchOutput, request_id: str, prompt: Optional[str], prompt_ids: list[int]
                   ) -> RequestOutput:
    """A search's beams as one finished RequestOutput, one CompletionOutput a beam, best first (how
    the server answers `use_beam_search`)."""
    samples = [CompletionOutput(index=i, text=beam.text or "", token_ids=beam.tokens[len(prompt_ids):],
                                exit_depths=list(beam.exit_depths), finish_reason=beam.finish_reason,
                                cumulative_logprob=beam.cum_logprob) for i, beam in enumerate(result.sequences)]
    return RequestOutput(request_id, prompt, list(prompt_ids), samples, True)


# SamplingParams fields a beam search takes (n: the width; the sampling filters and the seed are
# accepted and have no effect); any other field away from its default cannot apply to it.
BEAM_FIELDS = frozenset({"n", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos",
                         "stop_token_ids", "skip_special_tokens", "include_stop_str_in_output", "priority",
                         "speculative", "truncate_prompt_tokens", "truncation_side"})


def beam_params(params: SamplingParams, max_tokens: int, length_penalty: float) -> BeamSearchParams:
    """The beam search a request's SamplingParams ask for (`use_beam_search`: n beams); a
    ConfigError names a field set that a beam search cannot honour."""
    for f in dataclasses.fields(SamplingParams):
        if f.init and f.name not in BEAM_FIELDS and getattr(params, f.name) != f.default:
            raise ConfigError(f"{f.name} cannot be combined with use_beam_search (beam search takes n, max_tokens, "
                              "ignore_eos, stop_token_ids and length_penalty)")
    return BeamSearchParams(beam_width=params.n, max_tokens=max_tokens, ignore_eos=params.ignore_eos,
                            temperature=params.temperature, length_penalty=length_penalty,
                            include_stop_str_in_output=params.include_stop_str_in_output,
                            stop_token_ids=tuple(params.stop_token_ids or ()))
