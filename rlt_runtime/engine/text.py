"""Incremental output text with stop strings (the text never includes a stop string)."""

from __future__ import annotations

from typing import Optional, Sequence, Union

from ..models.tokenizer import IncrementalDetokenizer, Tokenizer
from .stop_matcher import StopAutomaton, StopMatcher


class TextTracker:
    """Detokenizes one sequence token by token and watches for stop strings.

    `text` is everything decoded so far (cut before a matched stop string). `stable_text()` holds
    back a tail that could still grow into a stop string, so streamed deltas never have to be
    taken back. Without stop strings nothing needs the text token by token: tokens are queued
    and decoded in one batch when the text is read (once per finished request offline, once per
    step while streaming). Stop strings are matched by one automaton (stop_matcher.py): each new
    character costs amortized O(1), however many stop strings there are.

    stop: the stop strings, or their automaton (built once and shared by a request's samples).
    skip_special_tokens: leave special tokens out of the text. include_stop: keep a matched stop
    string at the end of the text (it is still where generation ends).
    """

    def __init__(self, tokenizer: Optional[Tokenizer], stop: Union[Sequence[str], StopAutomaton], prompt_ids: list[int],
                 skip_special_tokens: bool = True, include_stop: bool = False):
        self._detok = (IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
                       if tokenizer is not None else None)
        self._include_stop = include_stop
        if not isinstance(stop, StopAutomaton):
            stop = StopAutomaton(stop) if stop else None
        self._stop = StopMatcher(stop) if stop is not None and stop.stops else None
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
        if self._stop is None:
            self._queued.append(token_id)
            return None
        piece = self._detok.add(token_id)
        self._text += piece
        return self._check(piece)

    def finish(self) -> Optional[str]:
        """Flush characters held back by the detokenizer (end of generation); returns the stop
        string the flushed characters completed, if any (the text is cut before it as usual)."""
        if self._detok is None or self.stopped_by is not None:
            return None
        text = self.text  # tokens still queued (no stop strings) decode before the flush
        piece = self._detok.flush()
        self._text = text + piece
        return self._check(piece)

    def _check(self, piece: str) -> Optional[str]:
        """Scan the newly appended text; on a match, cut the text before it (the earliest-starting
        match among those the piece completes; ties: first in the stop list)."""
        if self._stop is None:
            return None
        hit = self._stop.scan(piece)
        if hit is None:
            return None
        start, stop = hit
        self._text = self._text[:start + len(stop) if self._include_stop else start]
        self.stopped_by = stop
        return stop

    def stable_text(self, finished: bool) -> str:
        """Text that can no longer change: drops a tail that is a prefix of some stop string."""
        if finished or self._stop is None or self.stopped_by is not None:
            return self.text
        return self._text[: len(self._text) - self._stop.pending]
