"""Stop-string matching with one Aho–Corasick automaton over all of a request's stop strings.

`StopAutomaton` is built once per request (O(total characters of the stop strings)) and shared by
its n samples; each sample scans its text with its own `StopMatcher`. Scanning costs amortized
O(1) state moves per character, independent of how many stop strings there are or how long they
are: a character takes one trie edge (or stays at the root), and each failure move shortens the
matched suffix by at least one character, so failure moves never outnumber characters scanned.
"""

from __future__ import annotations

from collections import deque
from typing import Optional, Sequence


class StopAutomaton:
    """The trie of the stop strings with failure links.

    State 0 is the root (the empty prefix); every other state is a distinct prefix of some stop
    string. `_fail[q]` is the state of the longest proper suffix of q's prefix that is itself a
    prefix; `_longest[q]` is the index (into `stops`, first in list order among duplicates) of the
    longest stop string that ends q's prefix, or -1.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = list(stops)
        self._edges: list[dict[str, int]] = [{}]
        self._depth = [0]
        self._longest = [-1]
        for index, stop in enumerate(self.stops):
            state = 0
            for ch in stop:
                child = self._edges[state].get(ch)
                if child is None:
                    child = len(self._edges)
                    self._edges[state][ch] = child
                    self._edges.append({})
                    self._depth.append(self._depth[state] + 1)
                    self._longest.append(-1)
                state = child
            if self._longest[state] < 0:
                self._longest[state] = index
        self._fail = [0] * len(self._edges)
        queue = deque(self._edges[0].values())  # depth-1 states fall back to the root
        while queue:  # breadth first: a state's failure target is shallower, so already final
            state = queue.popleft()
            if self._longest[state] < 0:
                self._longest[state] = self._longest[self._fail[state]]
            for ch, child in self._edges[state].items():
                back = self._fail[state]
                while back and ch not in self._edges[back]:
                    back = self._fail[back]
                self._fail[child] = self._edges[back].get(ch, 0)
                queue.append(child)

    @property
    def num_states(self) -> int:
        return len(self._edges)


class StopMatcher:
    """Scans one sequence's text, piece by piece, for the stop strings of an automaton.

    `steps` counts state moves (trie edges, failure moves, root stays): at most twice the
    characters scanned, whatever the stop strings.
    """

    def __init__(self, automaton: StopAutomaton):
        self.automaton = automaton
        self._state = 0
        self.scanned = 0  # characters scanned so far
        self.steps = 0

    def scan(self, piece: str) -> Optional[tuple[int, str]]:
        """Scan the next characters of the text. Returns (start, stop) of the match that starts
        first among those ending inside `piece` (ties: first in the stop list), start counted
        from the text's beginning; None if no stop string ends inside `piece`."""
        a = self.automaton
        edges, fail, longest, depth = a._edges, a._fail, a._longest, a._depth
        state, steps, best = self._state, self.steps, None
        for end, ch in enumerate(piece, self.scanned):
            while state and ch not in edges[state]:
                state = fail[state]
                steps += 1
            state = edges[state].get(ch, 0)
            steps += 1
            index = longest[state]
            if index >= 0:
                start = end + 1 - len(a.stops[index])
                if best is None or (start, index) < best:
                    best = (start, index)
        self._state, self.steps = state, steps
        self.scanned += len(piece)
        return None if best is None else (best[0], a.stops[best[1]])

    @property
    def pending(self) -> int:
        """Length of the longest suffix of the scanned text that is a prefix of a stop string
        (what a later character could still complete into a match)."""
        return self.automaton._depth[self._state]
