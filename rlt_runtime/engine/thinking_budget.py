"""`thinking_token_budget`: a request's reasoning ends after at most that many tokens (vLLM's).

The reasoning is the text after the think-start marker (`<think>`, as a token sequence of the
engine's tokenizer) and up to the think-end marker (`</think>`). It may open in the prompt (a
template that pre-fills `<think>`): the prompt's tokens after its last open marker count, as do
the output's. Once the reasoning holds `budget` tokens, the request's next-token mask allows only
the end marker's next token until the marker is complete (a marker the model already began is
continued); then generation goes on freely, and a later `<think>` starts a new count.

`ThinkingBudget` is a host-side matcher with the interface of xgrammar's `GrammarMatcher`
(`fill_next_token_bitmask`, `accept_token`, `rollback`, `is_terminated`), so the engine's mask
paths (async steps, speculation's draft checks, preemption) treat a budgeted request as a guided
one. A guided request's grammar matcher is wrapped: the forced token replaces the grammar's row
only where the grammar allows it (the grammar wins otherwise).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple, Optional

import torch

THINK_START, THINK_END = "<think>", "</think>"
MAX_ROLLBACK = 256  # tokens `rollback` can undo (the engine undoes at most a round's drafts)


class _State(NamedTuple):
    thinking: bool
    count: int  # reasoning tokens so far (the markers' own tokens included)
    tail: tuple  # the last max(len(start), len(end)) tokens, for marker matching


class ThinkingBudget:
    """The budget of one sequence; its state follows the committed (or checked) tokens only."""

    def __init__(self, budget: int, start_ids: list[int], end_ids: list[int], prompt_ids: list[int], inner=None):
        """budget >= 0; start_ids / end_ids: the markers' token ids (non-empty); inner: the
        request's grammar matcher, or None."""
        self.budget, self.start, self.end, self.inner = budget, tuple(start_ids), tuple(end_ids), inner
        self.width = max(len(self.start), len(self.end))
        opened = _last(prompt_ids, self.start)
        thinking = opened > _last(prompt_ids, self.end)
        count = len(prompt_ids) - opened - len(self.start) if thinking else 0
        self.state = _State(thinking, count, tuple(prompt_ids[-self.width:]))
        self._history: deque[_State] = deque(maxlen=MAX_ROLLBACK)

    def forced(self) -> Optional[int]:
        """The token the next position must take, or None."""
        s = self.state
        if not s.thinking or s.count < self.budget:
            return None
        for k in range(len(self.end) - 1, 0, -1):  # the end marker's part already written, if any
            if s.tail[-k:] == self.end[:k]:
                return self.end[k]
        return self.end[0]

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Row `row` of the int32 bitmask: the inner grammar's row (all ones without one), or only
        the forced token where the grammar allows it."""
        if self.inner is not None:
            self.inner.fill_next_token_bitmask(bitmask, row)
        else:
            bitmask[row] = -1
        token = self.forced()
        if token is not None and (int(bitmask[row, token // 32]) >> (token % 32)) & 1:
            bitmask[row] = 0
            bitmask[row, token // 32] = _bit(token % 32)

    def accept_token(self, token: int) -> bool:
        """Advance by `token`; False (state unchanged) when the budget or the grammar refuses it
        (under a grammar the mask decides what the budget forces, so only the grammar refuses)."""
        forced = self.forced()
        if forced is not None and token != forced and self.inner is None:
            return False
        if self.inner is not None and not self.inner.accept_token(token):
            return False
        s = self.state
        tail = (s.tail + (token,))[-self.width:]
        self._history.append(s)
        if tail[-len(self.end):] == self.end:
            self.state = _State(False, 0, tail)
        elif tail[-len(self.start):] == self.start:
            self.state = _State(True, 0, tail)
        else:
            self.state = _State(s.thinking, s.count + s.thinking, tail)
        return True

    def rollback(self, num_tokens: int) -> None:
        if self.inner is not None:
            self.inner.rollback(num_tokens)
        for _ in range(num_tokens):
            self.state = self._history.pop()

    def is_terminated(self) -> bool:
        return self.inner is not None and self.inner.is_terminated()


def _bit(position: int) -> int:
    """int32 word value with only bit `position` set (bit 31 is the sign bit)."""
    return -(1 << 31) if position == 31 else 1 << position


def _last(ids: list[int], marker: tuple) -> int:
    """Index where the last occurrence of `marker` in `ids` starts, or -1."""
    n = len(marker)
    for i in range(len(ids) - n, -1, -1):
        if tuple(ids[i:i + n]) == marker:
            return i
    return -1
