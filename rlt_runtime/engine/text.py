"""Incremental output text with stop strings (the text never includes a stop string)."""

from __future__ import annotations

from typing import Optional

from ..models.tokenizer import IncrementalDetokenizer, Tokenizer


class TextTracker:
    """Detokenizes one sequence token by token and watches for stop strings.

    `text` is everything decoded so far (cut before a matched stop string). `stable_text()` holds
    back a tail that could still grow into a stop string, so streamed deltas never have to be
    taken back. Without stop strings nothing needs the text token by token: tokens are queued
    and decoded in one batch when the text is read (once per finished request offline, once per
    step while streaming).
    """

    def __init__(self, tokenizer: Optional[Tokenizer], stop: list[str], prompt_ids: list[int]):
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids) if tokenizer is not None else None
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1  # chars a new match can reach back
        self._text = ""
        self._queued: list[int] = []
        self.stopped_by: Optional[str] = None

    @property
    def text(self) -> str:
        if self._queued:
            queued, self._queued = self._queued, []
            self._text += self._detok.add_many(queued)
        return self._text

    def add(self, token_id: int) -> Optional[str]:
        """Feed a token; returns the stop string it completed, if any."""
        if self._detok is None or self.stopped_by is not None:
            return None
        if not self._stop:
            self._queued.append(token_id)
            return None
        before = len(self._text)
        self._text += self._detok.add(token_id)
        return self._check(before)

    def finish(self) -> Optional[str]:
        """Flush characters held back by the detokenizer (end of generation); returns the stop
        string the flushed characters completed, if any (the text is cut before it as usual)."""
        if self._detok is None or self.stopped_by is not None:
            return None
        before = len(self.text)
        self._text += self._detok.flush()
        return self._check(before)

    def _check(self, before: int) -> Optional[str]:
        if not self._stop:
            return None
        start = max(0, before - self._hold)
        best = None
        for s in self._stop:
            i = self._text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        self._text = self._text[: best[0]]
        self.stopped_by = best[1]
        return best[1]

    def stable_text(self, finished: bool) -> str:
        """Text that can no longer change: drops a tail that is a prefix of some stop string."""
        if finished or not self._stop:
            return self.text
        keep = len(self.text)
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    keep = min(keep, len(self.text) - k)
                    break
        return self.text[:keep]
