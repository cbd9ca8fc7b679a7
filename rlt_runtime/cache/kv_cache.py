"""Per-request block tables over the shared pool, one table per plane, with prefix caching.

Plain Python. Every logical block a request owns has one physical block per plane. Allocation
is incremental (grow as tokens are scheduled); the device copy of the tables is updated from the
`(plane, slot, logical_index, block)` records collected in `pending_updates`.
"""

from __future__ import annotations

import hashlib
import struct

from ..stable_hash import MASK63
from .block_pool import BlockPool


def chain_hashes(token_ids, block_size: int, salt: int) -> list[int]:
    """Hashes of the full logical blocks of `token_ids` (a trailing partial block is left out),
    each chained over every earlier block: BLAKE2b of (the previous block's digest, the 63-bit salt,
    the block's token ids as little-endian int64), the same in every process. The ids are packed
    once, so a block costs one digest (a 32K-token prompt: 2,048 blocks)."""
    width = block_size * 8
    raw = struct.pack(f"<{len(token_ids)}q", *token_ids)
    key = struct.pack("<q", salt)
    hashes, parent = [], bytes(8)
    for start in range(0, len(raw) - width + 1, width):
        parent = hashlib.blake2b(parent + key + raw[start : start + width], digest_size=8).digest()
        hashes.append(int.from_bytes(parent, "little") & MASK63)
    return hashes


class KVCacheManager:
    """Blocks of running requests, keyed by request id."""

    def __init__(self, num_blocks: int, block_size: int, num_planes: int, *, enable_prefix_caching: bool,
                 cache_salt: int = 0):
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.num_planes = num_planes
        self.enable_prefix_caching = enable_prefix_caching
        self.cache_salt = cache_salt
        self._tables: dict[str, list[tuple[int, ...]]] = {}  # request id -> per logical block, per-plane ids
        self._hashes: dict[str, list[int]] = {}  # published/matched block hashes of each request
        self.pending_updates: list[tuple[int, int, int, int]] = []

    # ---- queries -------------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, request_id: str, num_tokens: int) -> int:
        """Physical blocks needed so the request covers positions [0, num_tokens)."""
        have = len(self._tables.get(request_id, ()))
        return max(0, self.blocks_for(num_tokens) - have) * self.num_planes

    def table(self, request_id: str) -> list[tuple[int, ...]]:
        return self._tables.get(request_id, [])

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free / self.pool.num_blocks

    # ---- prefix cache --------------------------------------------------------------------------
    def block_hashes(self, token_ids: list[int], salt: int) -> list[int]:
        """Chained hashes of the full blocks of `token_ids` excluding its last token (never cached:
        its logits are needed)."""
        full = (len(token_ids) - 1) // self.block_size * self.block_size
        return chain_hashes(token_ids[:full], self.block_size, salt)

    def cached_prefix_cost(self, hashes: list[int]) -> tuple[int, int]:
        """For a new request with these block hashes: (tokens it would find cached, physical blocks
        attaching them takes from the free count, i.e. those of idle cached entries). No references taken."""
        n = taken = 0
        for h in hashes:
            if not self.pool.peek(h):
                break
            n += self.block_size
            taken += self.pool.idle_blocks(h)
        return n, taken

    def attach_prefix(self, request_id: str, slot: int, hashes: list[int]) -> int:
        """Reuse cached leading blocks for a new request; returns the cached token count."""
        assert request_id not in self._tables
        table: list[tuple[int, ...]] = []
        attached: list[int] = []
        for h in hashes:
            planes = self.pool.lookup(h)
            if planes is None:
                break
            self._record(slot, len(table), planes)
            table.append(planes)
            attached.append(h)
        self._tables[request_id] = table
        self._hashes[request_id] = attached
        return len(table) * self.block_size

    def publish(self, request_id: str, hashes: list[int], num_computed: int) -> None:
        """Publish the request's blocks with these hashes (`block_hashes` of its prompt) whose K/V
        is now computed (all planes)."""
        table, own = self._tables[request_id], self._hashes[request_id]
        limit = min(num_computed // self.block_size, len(hashes))
        for i in range(len(own), limit):
            self.pool.publish(hashes[i], table[i])
            own.append(hashes[i])

    # ---- allocation ----------------------------------------------------------------------------
    def allocate(self, request_id: str, slot: int, num_tokens: int) -> bool:
        """Grow the request to cover positions [0, num_tokens); all-or-nothing."""
        table = self._tables.setdefault(request_id, [])
        self._hashes.setdefault(request_id, [])
        need = self.blocks_for(num_tokens) - len(table)
        if need <= 0:
            return True
        blocks = self.pool.allocate(need * self.num_planes)
        if blocks is None:
            return False
        for i in range(need):
            planes = tuple(blocks[i * self.num_planes : (i + 1) * self.num_planes])
            self._record(slot, len(table), planes)
            table.append(planes)
        return True

    def free(self, request_id: str) -> None:
        """Return every block of the request (cached ones stay in the prefix cache)."""
        table = self._tables.pop(request_id, [])
        self._hashes.pop(request_id, None)
        for planes in reversed(table):
            self.pool.release(planes)

    def _record(self, slot: int, logical: int, planes: tuple[int, ...]) -> None:
        for p, b in enumerate(planes):
            self.pending_updates.append((p, slot, logical, b))

    def take_updates(self) -> list[tuple[int, int, int, int]]:
        """The step's table writes, one per (plane, slot, logical block): the last one recorded. A
        slot freed and reused within a step (a preempted request's, then a new one's) records its
        entries twice, and the device applies the writes as one scatter whose duplicate indices
        would land in no defined order."""
        updates, self.pending_updates = self.pending_updates, []
        last = {(p, s, l): b for p, s, l, b in updates}
        return [(p, s, l, b) for (p, s, l), b in last.items()]

    def check_invariant(self) -> None:
        self.pool.check_invariant()
        owned: dict[int, int] = {}
        for table in self._tables.values():
            for planes in table:
                for b in planes:
                    owned[b] = owned.get(b, 0) + 1
        for b, n in owned.items():
            assert self.pool._refs[b] == n, f"block {b}: {n} owners but refcount {self.pool._refs[b]}"
        assert sum(1 for r in self.pool._refs if r > 0) == len(owned), "referenced block with no owner"
