"""ForwardBatch: what a model's stage functions need to run attention for one pass.

The model runner builds one per pass (a prefill chunk set, or one loop of a decode step) from
device tensors it owns. Models call `attend` with q/k/v and the layout's `PlaneSpec`; the batch
computes slot mappings once per write plane, writes rotated K/V into the paged cache and runs
paged attention with loop-depth indirection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..cache.layout import PlaneSpec

# FP8 K/V scale of every (cache layer, KV head): fixed, uncalibrated. A stored e4m3 value is the
# key/value itself, so values keep 3 mantissa bits over |x| in [2^-6, 448] (subnormals down to
# 2^-9) and saturate at ±448; RMS-normed activations through bf16 projections stay well inside.
KV_FP8_SCALE = 1.0


@dataclass
class KVCacheTensors:
    """The paged pool and its tables (all persistent, owned by the model runner).

    k, v: [num_cache_layers, num_blocks, block_size, kv_heads, head_dim]
    block_tables: [num_planes, num_slots, max_blocks_per_seq] int32 (-1 = unallocated)
    key_depth: [num_blocks, block_size] int32 — last loop index each token ran (via plane 0)
    k_scale, v_scale: fp32 [num_cache_layers, kv_heads] with float8_e4m3fn planes, else None
    """

    k: torch.Tensor
    v: torch.Tensor
    block_tables: torch.Tensor
    key_depth: torch.Tensor
    k_scale: Optional[torch.Tensor] = None
    v_scale: Optional[torch.Tensor] = None

    @property
    def block_size(self) -> int:
        return self.k.shape[2]


@dataclass
class ForwardBatch:
    """One pass over M query tokens grouped into S sequences.

    positions [M] int64, token_slots [M] int32 (request slot of each token), depth_limit [M]
    int32 or None (a token writes K/V at loop t only while t < limit), seq_slots [S] int32,
    seq_lens [S] int32, query_start_loc [S+1] int32, active [1] int32 or None (live rows),
    active_seqs [1] int32 or None (live sequences; default `active`: decode passes have one query
    per sequence, so rows and sequences coincide). decode_from: 0 for decode passes (every row is
    a generated token), int32 [S] for prefill passes (the sequence's first generated position:
    recomputed outputs take the decode arithmetic there, see `rlt_kernels.attention`), None when
    every row is a prompt token. key_depth_reads: False when every key the pass can see ran every
    loop (prompt tokens, and the tokens of requests that never exit early), so no key is read from
    an earlier loop's plane and attention skips the key-depth table. one_query_per_sequence: rows
    and sequences coincide (query_start_loc 0..S, decode_from 0) and no row reads a key another
    row writes, so `attend` rotates, writes and attends in one launch (`rope_paged_attention`).
    """

    ops: Any
    kv: KVCacheTensors
    positions: torch.Tensor
    token_slots: torch.Tensor
    seq_slots: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    cos_sin: torch.Tensor
    rope_style: str
    depth_limit: Optional[torch.Tensor] = None
    active: Optional[torch.Tensor] = None
    active_seqs: Optional[torch.Tensor] = None  # live sequences when they differ from live rows (prefill)
    workspace: Optional[torch.Tensor] = None
    decode_from: Any = None
    key_depth_reads: bool = True
    one_query_per_sequence: bool = False  # decode and draft passes: RoPE and the K/V write inside the attention launch
    padding_unread: bool = False  # rows past `active` are a graph bucket's padding whose results nothing reads
    _slots: dict = field(default_factory=dict, repr=False)

    @property
    def dense_active(self) -> Optional[torch.Tensor]:
        """The live-row count the model's row-wise dense kernels (linear layers, norms) take: `active`,
        or None where the padding rows are never read (fixed-depth decode steps). They then compute
        those rows too, and no launch reads the count before its loads (H200, Ouro's decode chain of
        96 layer-loops at batch 1: 4.33 ms without the count, 4.49 with it; docs/perf/engine.md)."""
        return None if self.padding_unread else self.active

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    def slot_mapping(self, spec: PlaneSpec) -> torch.Tensor:
        """int64 [M] cache slot of each token in the spec's write plane (-1: do not write)."""
        key = (spec.write_plane, spec.query_depth if self.depth_limit is not None else None)
        cached = self._slots.get(key)
        if cached is not None:
            return cached
        slots = self._plane_slots()[spec.write_plane]
        if self.depth_limit is not None:
            slots = torch.where(self.depth_limit > spec.query_depth, slots, -1)
        self._slots[key] = slots
        return slots

    def _plane_slots(self) -> torch.Tensor:
        """int64 [planes, M]: every token's cache slot in every plane (-1 where no block is
        allocated, and for rows past the live count), computed once per pass (a step's loops
        write different planes)."""
        every = self._slots.get("planes")
        if every is None:
            every = self._slots["planes"] = self.ops.cache_slots(self.kv.block_tables, self.token_slots, self.positions,
                                                                 self.kv.block_size, active_rows=self.active)
        return every

    def attend(self, cache_layer: int, q, k, v, spec: PlaneSpec, *, q_bias=None, k_bias=None) -> torch.Tensor:
        """Rotate q/k, write k/v to the cache, attend. q [M, H, D], k/v [M, KVH, D] -> [M, H*D]."""
        ops = self.ops
        k_cache, v_cache = self.kv.k[cache_layer], self.kv.v[cache_layer]
        scales = {} if self.kv.k_scale is None else dict(k_scale=self.kv.k_scale[cache_layer],
                                                         v_scale=self.kv.v_scale[cache_layer])
        planes = dict(seq_slots=self.seq_slots, query_depth=spec.query_depth,
                      key_depth=self.kv.key_depth if spec.use_key_depth and self.key_depth_reads else None,
                      plane_offset=spec.plane_offset, plane_modulus=spec.plane_modulus, workspace=self.workspace,
                      active_seqs=self.active if self.active_seqs is None else self.active_seqs)
        if self.one_query_per_sequence:
            out = ops.rope_paged_attention(
                q, k, v, self.positions, self.cos_sin, k_cache, v_cache, self.slot_mapping(spec), self.kv.block_tables,
                self.seq_lens, self.query_start_loc, style=self.rope_style, q_bias=q_bias, k_bias=k_bias,
                **planes, **scales,
            )
            return out.view(out.shape[0], -1)
        q_rot = ops.rope_kv_scatter(
            q, k, v, self.positions, self.cos_sin, k_cache, v_cache, self.slot_mapping(spec),
            style=self.rope_style, q_bias=q_bias, k_bias=k_bias, active_rows=self.active, **scales,
        )
        out = ops.paged_attention(
            q_rot, k_cache, v_cache, self.kv.block_tables, self.seq_lens, self.query_start_loc,
            decode_from=self.decode_from, **planes, **scales,
        )
        return out.view(out.shape[0], -1)
