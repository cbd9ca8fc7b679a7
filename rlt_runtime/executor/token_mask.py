"""Guided-decoding token masks on the device: a persistent per-slot bitmask applied before sampling.

    mask  int32 [S, W]   W = ceil(V / 32); bit b of word w allows token 32 * w + b

A slot's row is written when its request is admitted: all ones (every token allowed) without
`allowed_token_ids`, so its logits pass bit for bit unchanged, else the bits of those ids (the row
then stays as it is for the request's life); before each step the host writes the rows of the step's
guided slots (`write`, with the step's other host→device updates, outside the step program; the
host gives a guided request with allowed_token_ids the two masks' intersection). The
step programs apply the rows of their slots to the processed logits (`apply_token_bitmask`:
disallowed tokens get -inf) in the same program variant as logit processing, so CUDA graphs
capture it with the buffer at a fixed address. A speculative round's verify rows of guided
requests take per-position rows from the host instead (`apply_rows`; `speculative.py`). Plain
torch ops: the same code runs on CPU, under the Triton interpreter and inside CUDA graphs or
torch.compile.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .staging import upload_arrays


def allowed_words(token_ids, vocab_size: int) -> torch.Tensor:
    """int32 [ceil(vocab_size / 32)] CPU bitmask row allowing exactly `token_ids` (ids < vocab_size)."""
    bits = np.zeros(-(-vocab_size // 32) * 32, dtype=bool)
    bits[np.asarray(token_ids, dtype=np.int64)] = True
    return torch.from_numpy(np.packbits(bits, bitorder="little").view(np.int32).copy())


def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """int32 [rows, ceil(vocab_size / 32)] CPU bitmask allowing every token (matchers fill its rows)."""
    return torch.full((rows, -(-vocab_size // 32)), -1, dtype=torch.int32)


def restrict(masks: torch.Tensor, allowed) -> None:
    """AND the bitmask rows `masks` (int32 [B, W], CPU) with `allowed` (int32 [W] or None) in place;
    a row the two leave empty keeps its own bits (the grammar wins over a request's own bans)."""
    if allowed is None:
        return
    both = masks & allowed
    empty = ~both.any(dim=1)
    masks.copy_(torch.where(empty[:, None], masks, both))


def unpack_bitmask(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [B, vocab_size]: bit t % 32 of words[:, t // 32] (int32 [B, W])."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = (words[:, :, None] >> shifts) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask(logits: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """fp32 logits [B, V] with -inf where the bitmask rows `words` (int32 [B, W]) clear a token's bit
    (a new tensor; allowed tokens keep their values bit for bit)."""
    allowed = unpack_bitmask(words, logits.shape[1])
    return logits.masked_fill(~allowed, -math.inf)


class TokenMask:
    """The per-slot bitmask buffer and its host-side updates."""

    def __init__(self, num_slots: int, vocab_size: int, device):
        self.vocab_size = vocab_size
        self.words = -(-vocab_size // 32)
        self.device = torch.device(device)
        self.mask = torch.full((num_slots, self.words), -1, dtype=torch.int32, device=self.device)

    @property
    def nbytes(self) -> int:
        """Device bytes of the per-slot bitmasks (what the KV planner sets aside)."""
        return self.mask.numel() * self.mask.element_size()

    def write(self, admitted, guided_slots: list[int], rows) -> None:
        """Set the rows of the admitted sequences (`SeqInput`s: `slot`, `params`) to all ones, or to
        their params' allowed_token_ids, then the guided slots' rows to `rows` (int32
        [len(guided_slots), W], a CPU tensor or array): one upload for all."""
        guided = set(guided_slots)  # (their rows come with `rows`: each slot is written once)
        restricted = [a for a in admitted if a.params.allowed_token_ids is not None and a.slot not in guided]
        reset = [a.slot for a in admitted if a.params.allowed_token_ids is None]
        slots = [a.slot for a in restricted] + list(guided_slots)
        if not reset and not slots:
            return
        arrays = {"reset": np.asarray(reset, np.int64), "slot": np.asarray(slots, np.int64)}
        if slots:
            own = [allowed_words(a.params.allowed_token_ids, self.vocab_size).numpy()[None] for a in restricted]
            given = [np.asarray(rows, np.int32).reshape(len(guided_slots), self.words)] if guided_slots else []
            arrays["rows"] = np.concatenate(own + given)
        dev = upload_arrays(arrays, self.device)
        if reset:
            self.mask[dev["reset"]] = -1
        if slots:
            self.mask[dev["slot"]] = dev["rows"].view(len(slots), self.words)

    def apply(self, logits: torch.Tensor, idx: torch.Tensor, raw: torch.Tensor | None = None) -> torch.Tensor:
        """`apply_rows` with the rows of slots idx (int64 [B])."""
        return self.apply_rows(logits, self.mask.index_select(0, idx), raw)

    @staticmethod
    def apply_rows(logits: torch.Tensor, words: torch.Tensor, raw: torch.Tensor | None = None) -> torch.Tensor:
        """`apply_token_bitmask` with the bitmask rows `words` (int32 [B, W]) on the processed logits.

        The grammar wins over a request's own bans: where the processed logits (min_tokens holding
        back EOS, bad_words, a -inf logit_bias) leave no token the grammar allows, the row is the
        grammar's mask over ``raw`` (the unprocessed logits [B, V]), so a grammar that can only end
        ends, rather than the sampler choosing among -inf everywhere."""
        if raw is None:
            return apply_token_bitmask(logits, words)
        banned = ~unpack_bitmask(words, logits.shape[1])
        masked = logits.masked_fill(banned, -math.inf)
        stuck = masked.amax(dim=1) == -math.inf
        return torch.where(stuck[:, None], raw.to(masked.dtype).masked_fill(banned, -math.inf), masked)
