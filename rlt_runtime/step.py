"""The step description: what the engine hands an executor for one step, as plain data.

Everything here is made of ints, lists, `SamplingParams` (plain values) and numpy arrays, so a
step pickles unchanged to worker processes. A sequence's `SamplingParams` cross once, in the step
that admits it (the worker keeps what it needs in per-slot device state); every other step
carries only the few per-row values below. Sequences are named by `key`, the engine's index of
the live request in the step (`StepInput.keys` order); results come back under the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .sampling_params import SamplingParams


@dataclass
class SeqInput:
    """What a step reads of one sequence (the subset of the engine's Request the device needs).

    For sequences admitted this step params holds the request's SamplingParams (the worker writes
    its slot's sampling and logit-processing state from them; None in every other step),
    output_token_ids holds every committed output (the logit processing's counts continue from
    them), and min_token_stops and bad_word_ids are filled; otherwise output_token_ids holds only
    the newest output and the other two are empty. prompt_token_ids is the whole prompt for
    admitted sequences and those computing prompt log-probabilities, else empty."""

    key: int
    slot: int
    row_key: int
    generation: int
    min_loops: int
    depth_limit: int
    num_prompt_tokens: int
    prefill_target: int
    prompt_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    min_token_stops: list[int] = field(default_factory=list)
    bad_word_ids: list[list[int]] = field(default_factory=list)
    processes_logits: bool = False
    wants_logprobs: bool = False
    needs_prompt_logprobs: bool = False
    num_top_logprobs: int = 0  # top alternatives reported with each sampled token (params.logprobs or 0)
    num_prompt_top_logprobs: int = 0  # top alternatives with each prompt log-probability (params.prompt_logprobs or 0)
    greedy: bool = True  # temperature 0 (params.greedy)
    params: Optional[SamplingParams] = None


@dataclass
class ChunkInput:
    """Prompt (or recompute) tokens [start, start + len(token_ids)) of one sequence."""

    request: SeqInput
    start: int
    token_ids: list[int]
    depths: list[int]  # loops each token runs
    sample: bool  # the chunk completes a fresh prompt: sample the first output token


@dataclass
class StepInput:
    """One step: decode rows (with their trace depths), prefill chunks, slot set-up, block-table
    updates, swaps (by swap id: the saved K/V stays with the worker that copied it out)."""

    decodes: list[SeqInput] = field(default_factory=list)
    traces: list[list[int]] = field(default_factory=list)  # per decode row: depths of its next 1 (or k + 1) outputs
    num_drafts: list[int] = field(default_factory=list)
    round_k: int = 0
    prefills: list[ChunkInput] = field(default_factory=list)
    admitted: list[SeqInput] = field(default_factory=list)
    block_updates: list[tuple[int, int, int, int]] = field(default_factory=list)
    swap_out: list[tuple[int, list]] = field(default_factory=list)  # (swap id, per-logical-block plane tuples)
    swap_in: list[tuple[int, list]] = field(default_factory=list)  # (swap id, new plane tuples)
    swap_free: list[int] = field(default_factory=list)  # swap ids whose saved K/V is no longer needed
    guided_slots: list[int] = field(default_factory=list)
    guided_masks: Optional[object] = None  # int32 [len(guided_slots), ceil(vocab / 32)] on the CPU, or None

    def guided_drafting(self) -> list[int]:
        """Indices of the decode rows that draft in this step's round and carry a grammar (their
        drafts are checked on the host before verification: `LLMEngine._check_drafts`)."""
        if self.round_k == 0 or not self.guided_slots:
            return []
        guided = set(self.guided_slots)
        return [i for i, r in enumerate(self.decodes) if self.num_drafts[i] > 0 and r.slot in guided]


@dataclass
class StepOutput:
    """What a step returns, keyed like its input: rows (key, generation, kind, drafts) in result
    order, prefill chunks (key, generation, tokens), prompt log-probability runs (key, generation,
    first prompt index, count), and the host arrays (`StepResult`, or None for a step with no rows)."""

    rows: list = field(default_factory=list)
    prefills: list = field(default_factory=list)
    prompt_rows: list = field(default_factory=list)
    round_k: int = 0
    result: object = None
    device_ms: Optional[float] = None
