"""Stop-string matching with one Aho–Corasick automaton over all of a request's stop strings.

`StopAutomaton` is built once per SamplingParams (`SamplingParams.stop_automaton`, O(total
characters of the stop strings)) and shared by every prompt and sample using it; each sequence
scans its text with its own `StopMatcher`. Scanning costs amortized O(1) state moves per
character, independent of how many stop strings there are or how long they are: a character
takes one trie edge (or stays at the root), and each failure move shortens the matched suffix by
at least one character, so failure moves never outnumber characters scanned.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Optional, Sequence


class StopAutomaton:
    """The trie of the stop strings with failure links.

    State 0 is the root (the empty prefix); every other state is a distinct prefix of some stop
    string. `_edges` maps `state << 21 | ord(ch)` (code points are below 2**21) to the child state:
    one dict for the whole trie, about 100 bytes per state. `_fail[q]` is the state of the longest
    proper suffix of q's prefix that is itself a prefix; `_longest[q]` is the index (into `stops`,
    first in list order among duplicates) of the longest stop string that ends q's prefix, or -1;
    `_depth[q]` is the length of q's prefix. These are int32 arrays (4 bytes per state each).
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = list(stops)
        edges: dict[int, int] = {}
        children: list[list[int]] = [[]]  # per state: its children, for the breadth-first pass
        depth, longest = array("i", [0]), array("i", [-1])
        for index, stop in enumerate(self.stops):
            state = 0
            for ch in stop:
                key = state << 21 | ord(ch)
                child = edges.get(key)
                if child is None:
                    child = edges[key] = len(depth)
                    children[state].append(child)
                    children.append([])
                    depth.append(depth[state] + 1)
                    longest.append(-1)
                state = child
            if longest[state] < 0:
                longest[state] = index
        label = array("i", [0]) * len(depth)  # the code point of the edge into each state
        for key, child in edges.items():
            label[child] = key & 0x1FFFFF
        fail = array("i", [0]) * len(depth)
        queue = deque(children[0])  # depth-1 states fall back to the root
        while queue:  # breadth first: a state's failure target is shallower, so already final
            state = queue.popleft()
            if longest[state] < 0:
                longest[state] = longest[fail[state]]
            for child in children[state]:
                code, back = label[child], fail[state]
                while back and (back << 21 | code) not in edges:
                    back = fail[back]
                fail[child] = edges.get(back << 21 | code, 0)
                queue.append(child)
        self._edges, self._fail, self._longest, self._depth = edges, fail, longest, depth


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
        edges, fail, longest = a._edges, a._fail, a._longest
        state, steps, best = self._state, self.steps, None
        for end, ch in enumerate(piece, self.scanned):
            code = ord(ch)
            while state and (state << 21 | code) not in edges:
                state = fail[state]
                steps += 1
            state = edges.get(state << 21 | code, 0)
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
