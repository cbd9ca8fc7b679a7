"""Block pool: free list, reference counts and the prefix cache (plain Python, no torch).

A *logical block* of a request is `block_size` consecutive token positions; it owns one physical
block per plane. Prefix caching keys a full logical block of a prompt by a hash chained over
all earlier blocks' tokens, so a hit means the whole prefix matches. Cached blocks whose
reference count drops to zero stay cached and are evicted least-recently-used first when free
blocks run out.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional


class BlockPool:
    """Physical blocks 0..num_blocks-1. Invariant: free + cached-idle + referenced == num_blocks."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks
        # hash -> tuple of per-plane block ids; and the reverse map for eviction bookkeeping.
        self._cached: dict[int, tuple[int, ...]] = {}
        self._block_hash: dict[int, int] = {}
        self._idle: "OrderedDict[int, None]" = OrderedDict()  # cached hashes with no live reference (LRU)
        self._idle_count = 0  # blocks held by the idle entries
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ---- accounting --------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks available without touching live data (free list + evictable cached blocks)."""
        return len(self._free) + self._idle_count

    def check_invariant(self) -> None:
        """Raise AssertionError if the block accounting is inconsistent."""
        idle_blocks = {b for h in self._idle for b in self._cached[h]}
        free = set(self._free)
        used = {b for b, r in enumerate(self._refs) if r > 0}
        assert len(free) == len(self._free), "duplicate block in the free list"
        assert not (free & used), "a referenced block is on the free list"
        assert not (free & idle_blocks) and not (used & idle_blocks), "idle cached block is free or referenced"
        assert len(free) + len(idle_blocks) + len(used) == self.num_blocks, (
            f"block leak: free {len(free)} + cached-idle {len(idle_blocks)} + used {len(used)} != {self.num_blocks}"
        )
        assert all(r >= 0 for r in self._refs), "negative reference count"
        assert self._idle_count == len(idle_blocks), "idle block count out of step with the idle entries"

    # ---- allocation --------------------------------------------------------------------------
    def allocate(self, n: int) -> Optional[list[int]]:
        """n fresh blocks (refcount 1), evicting idle cached blocks LRU-first; None if impossible."""
        if n > self.num_free:
            return None
        while len(self._free) < n:
            self._evict_one()
        blocks = [self._free.pop() for _ in range(n)]
        for b in blocks:
            self._refs[b] = 1
        return blocks

    def _evict_one(self) -> None:
        h, _ = self._idle.popitem(last=False)
        self._idle_count -= len(self._cached[h])
        for b in self._cached.pop(h):
            del self._block_hash[b]
            self._free.append(b)

    def release(self, blocks) -> None:
        """Drop one reference from each block; unreferenced blocks go back to free or idle-cached."""
        for b in blocks:
            self._refs[b] -= 1
            if self._refs[b] < 0:
                raise AssertionError(f"block {b} released more often than referenced")
            if self._refs[b] == 0:
                h = self._block_hash.get(b)
                if h is None:
                    self._free.append(b)
                elif h not in self._idle and all(self._refs[x] == 0 for x in self._cached[h]):
                    self._idle[h] = None
                    self._idle_count += len(self._cached[h])

    # ---- prefix cache ------------------------------------------------------------------------
    def lookup(self, block_hash: int) -> Optional[tuple[int, ...]]:
        """Per-plane blocks cached under the hash (taking a reference), or None."""
        self.prefix_queries += 1
        planes = self._cached.get(block_hash)
        if planes is None:
            return None
        self.prefix_hits += 1
        if block_hash in self._idle:
            del self._idle[block_hash]
            self._idle_count -= len(planes)
        for b in planes:
            self._refs[b] += 1
        return planes

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix block (their K/V no longer matches, e.g. after new weights):
        idle ones go back to the free list, referenced ones are freed when released. Returns the
        entries dropped."""
        dropped = len(self._cached)
        for _ in range(len(self._idle)):
            self._evict_one()
        self._cached.clear()
        self._block_hash.clear()
        return dropped

    def peek(self, block_hash: int) -> bool:
        return block_hash in self._cached

    def idle_blocks(self, block_hash: int) -> int:
        """Blocks a lookup of this hash would take out of `num_free` (those of an idle cached entry)."""
        return len(self._cached[block_hash]) if block_hash in self._idle else 0

    def publish(self, block_hash: int, planes: tuple[int, ...]) -> None:
        """Register a request's full logical block (all planes computed) under its hash."""
        if block_hash in self._cached or any(b in self._block_hash for b in planes):
            return
        self._cached[block_hash] = planes
        for b in planes:
            self._block_hash[b] = block_hash
