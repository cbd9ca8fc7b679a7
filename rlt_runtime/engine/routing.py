"""Which replica runs a request: least outstanding work, with prompt-prefix affinity.

A replica's outstanding work is the tokens its unfinished requests may still cost: the prompt
until the first token comes back, plus each sample's tokens still allowed by max_tokens. A
request goes to the live replica with the least work (ties: the lowest index), except that
a prompt whose first full KV block was routed before goes back to the replica that took it, so
that replica's prefix cache serves the shared blocks, as long as that replica's work exceeds
the least loaded one's by at most `affinity_slack` tokens. Otherwise the least loaded replica
takes it and becomes the prefix's new home.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

from ..stable_hash import stable_hash


class Router:
    """Routing state of a data-parallel front end: outstanding work per replica and prefix homes.

    block_size: tokens per KV block (only full blocks are shared by prefix caching).
    affinity_slack: tokens of extra work a prefix's home may carry and still take the prefix.
    max_prefixes: prefix homes remembered (least recently used forgotten first).
    """

    def __init__(self, num_replicas: int, block_size: int, affinity_slack: int = 4096, max_prefixes: int = 65536):
        self.work = [0] * num_replicas
        self.block_size = block_size
        self.affinity_slack = affinity_slack
        self.max_prefixes = max_prefixes
        self._homes: OrderedDict[int, int] = OrderedDict()

    def prefix_key(self, token_ids: Sequence[int]) -> Optional[int]:
        """Key of the prompt's first full block; None for a prompt shorter than a block (or with
        ids that are not integers: the replica rejects those)."""
        head = list(token_ids[: self.block_size])
        if len(head) < self.block_size or any(type(t) is not int for t in head):
            return None
        return stable_hash("rlt.route", head)

    def choose(self, token_ids: Sequence[int], alive: Sequence[bool]) -> int:
        """The replica for a prompt (`alive[i]`: replica i can take requests; one must)."""
        candidates = [i for i, ok in enumerate(alive) if ok]
        least = min(candidates, key=lambda i: (self.work[i], i))
        key = self.prefix_key(token_ids)
        if key is None:
            return least
        home = self._homes.get(key)
        if home is not None and alive[home] and self.work[home] <= self.work[least] + self.affinity_slack:
            self._homes.move_to_end(key)
            return home
        self._homes[key] = least
        self._homes.move_to_end(key)
        if len(self._homes) > self.max_prefixes:
            self._homes.popitem(last=False)
        return least

    def add(self, replica: int, tokens: int) -> None:
        """Change replica's outstanding work by `tokens` (negative when work is done)."""
        self.work[replica] += tokens
