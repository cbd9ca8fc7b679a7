"""Incremental output text with stop strings (the text never includes a stop string)."""

from __future__ import annotations

from typing import Optional, Sequence, Union

from ..models.tokenizer import IncrementalDetokenizer, Tokenizer
from .stop_matcher import StopAutomaton, StopMatcher


class TextTracker:
    """Detokenizes one sequence token by token, watches for stop strings and hands out text deltas.

    The text is kept as a list of pieces (appending never copies what came before). `take_delta()`
    returns the stable text added since its previous call, in O(new characters): it holds back a
    tail that could still grow into a stop string, so streamed deltas never have to be taken back.
    `text` / `stable_text()` join the pieces (O(whole text); for cumulative outputs). Without stop
    strings nothing needs the text token by token: tokens are queued and decoded in one batch when
    text is read (once per finished request offline, once per step while streaming). Stop strings
    are matched by one automaton (stop_matcher.py) fed only the new text: each new character costs
    amortized O(1), however long the text is and however many stop strings there are.

    stop: the stop strings, or their automaton (built once and shared by a request's samples).
    skip_special_tokens: leave special tokens out of the text. include_stop: keep a matched stop
    string at the end of the text (it is still where generation ends). min_tokens: a stop string
    counts only when it ends in text of a token after the first min_tokens (it may start earlier),
    as vLLM does.
    """

    def __init__(self, tokenizer: Optional[Tokenizer], stop: Union[Sequence[str], StopAutomaton], prompt_ids: list[int],
                 skip_special_tokens: bool = True, include_stop: bool = False, min_tokens: int = 0):
        self._detok = (IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
                       if tokenizer is not None else None)
        self._include_stop = include_stop
        self._min_tokens = min_tokens
        self._num_tokens = 0  # tokens fed to add()
        if not isinstance(stop, StopAutomaton):
            stop = StopAutomaton(stop) if stop else None
        self._stop = StopMatcher(stop) if stop is not None and stop.stops else None
        self._pieces: list[str] = []  # the text; pieces[_first_unsent:] start at character _unsent_from
        self._length = 0
        self._sent = 0  # characters handed out by take_delta
        self._first_unsent = 0  # index of the piece holding character _sent
        self._unsent_from = 0  # character offset where piece _first_unsent starts
        self._queued: list[int] = []
        self.stopped_by: Optional[str] = None

    @property
    def text(self) -> str:
        """The whole text so far (joins every piece)."""
        self._drain()
        return "".join(self._pieces)

    def add(self, token_id: int) -> Optional[str]:
        """Feed a token; returns the stop string it completed, if any."""
        if self._detok is None or self.stopped_by is not None:
            return None
        self._num_tokens += 1
        if self._stop is None:
            self._queued.append(token_id)
            return None
        piece = self._detok.add(token_id)
        self._append(piece)
        return self._check(piece)

    def finish(self) -> Optional[str]:
        """Flush characters held back by the detokenizer (end of generation); returns the stop
        string the flushed characters completed, if any (the text is cut before it as usual)."""
        if self._detok is None or self.stopped_by is not None:
            return None
        self._drain()  # tokens still queued (no stop strings) decode before the flush
        piece = self._detok.flush()
        self._append(piece)
        return self._check(piece)

    def stable_text(self, finished: bool) -> str:
        """Text that can no longer change: drops a tail that is a prefix of some stop string."""
        text = self.text
        return text[: len(text) - self._held(finished)]

    def take_delta(self, finished: bool) -> str:
        """The stable text added since the previous call (all of the text on the first call)."""
        self._drain()
        end = self._length - self._held(finished)
        if end <= self._sent:
            return ""
        if end == self._length and self._sent == self._unsent_from and len(self._pieces) == self._first_unsent + 1:
            self._first_unsent += 1  # the delta is exactly the one unsent piece (the usual streaming step)
            self._sent = self._unsent_from = end
            return self._pieces[-1]
        tail = self._unsent_text()
        skip = self._sent - self._unsent_from
        delta = tail[skip: skip + end - self._sent]
        rest = tail[skip + len(delta):]
        self._pieces[self._first_unsent:] = [tail[:skip + len(delta)]] + ([rest] if rest else [])
        self._first_unsent += 1
        self._sent = self._unsent_from = end
        return delta

    def _held(self, finished: bool) -> int:
        """Characters at the end of the text that may still become part of a stop string."""
        if finished or self._stop is None or self.stopped_by is not None:
            return 0
        return self._stop.pending

    def _unsent_text(self) -> str:
        """The pieces from the one holding the first unsent character on, joined into one."""
        return "".join(self._pieces[self._first_unsent:])

    def _drain(self) -> None:
        if self._queued:
            queued, self._queued = self._queued, []
            self._append(self._detok.add_many(queued))

    def _append(self, piece: str) -> None:
        if piece:
            self._pieces.append(piece)
            self._length += len(piece)

    def _check(self, piece: str) -> Optional[str]:
        """Scan the newly appended text; on a match, cut the text before it (the earliest-starting
        match among those the piece completes; ties: first in the stop list). The cut never falls
        in text already handed out: held-back text covers every prefix of a stop string. Within the
        first min_tokens tokens the piece is scanned (a later match may start in it) but a match
        ending in it does not count."""
        if self._stop is None:
            return None
        hit = self._stop.scan(piece)
        if hit is None or self._num_tokens <= self._min_tokens:
            return None
        start, stop = hit
        cut = start + len(stop) if self._include_stop else start
        tail = self._unsent_text()[: cut - self._unsent_from]
        self._pieces[self._first_unsent:] = [tail] if tail else []
        self._length = cut
        self.stopped_by = stop
        return stop
