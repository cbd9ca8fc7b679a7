"""Tensor parallelism for the models: each rank holds a slice of every attention and MLP block.

Rank r of N keeps attention heads [r*H/N, (r+1)*H/N) and K/V heads [r*KVH/N, (r+1)*KVH/N): the
rows of the fused q/k/v weight (and Huginn's q/k biases) for those heads, the matching columns of
the output projection; and MLP columns [r*F/N, (r+1)*F/N): those rows of the gate and up halves,
those columns of the down projection. Everything else (embeddings, norms, Huginn's adapter, Ouro's
exit gate, the LM head) is replicated. Each output or down projection then yields an fp32 (fp64
with dtype float64) partial sum; `TensorParallel.sum` gathers the N partials and adds them in
rank order on every rank, so every rank holds the same bits (what the exit rules and the
sampler read) and a row's sum does not depend on the number of rows (an all-reduce may split its
tensor by size, which would change the order of additions with the batch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import ConfigError
from .fp8_weights import Fp8Weight


class TensorParallel:
    """This process's place in a tensor-parallel group of torch.distributed (gloo or NCCL)."""

    def __init__(self, rank: int, size: int, group=None):
        self.rank, self.size, self.group = rank, size, group

    def sum(self, part: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's `part` ([M, K] fp32), added in rank order: ((p0 + p1) + p2) ..."""
        import torch.distributed as dist

        part = part.contiguous()
        if part.device.type == "cuda":  # one collective into one buffer (capturable in a CUDA graph with NCCL)
            gathered = torch.empty((self.size, *part.shape), dtype=part.dtype, device=part.device)
            dist.all_gather_into_tensor(gathered, part, group=self.group)
            parts = gathered.unbind(0)
        else:
            parts = [torch.empty_like(part) for _ in range(self.size)]
            dist.all_gather(parts, part, group=self.group)
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        return total


def row_parallel_residual_norm(ops, x: torch.Tensor, weight, tp: Optional[TensorParallel], active, residual,
                               post_weight, next_weight, eps: float, mode: str, residual_out=None, normed_out=None):
    """`ops.residual_norm(x @ weight.T, residual, ...)`; returns (r, n). Without a group it is the
    one op `linear_residual_norm`, whose norm kernel adds a split-K linear's partials itself. In a
    group weight holds this rank's input columns: the ranks' partial products (fp32, or the
    residual's dtype when wider) are summed (see `TensorParallel.sum`) and rounded to the residual's dtype before the
    norm. normed_out: None, or an `Fp8Rows` for a W8A8 layer's input."""
    if tp is None:
        return ops.linear_residual_norm(x, weight, residual, post_weight, next_weight, eps, mode=mode,
                                        residual_out=residual_out, normed_out=normed_out, active_rows=active)
    wide = residual.dtype if residual.dtype == torch.float64 else torch.float32
    part = torch.empty((x.shape[0], weight.shape[0]), dtype=wide, device=residual.device)
    ops.linear(x, weight, out=part, active_rows=active)
    sub = tp.sum(part).to(residual.dtype)
    return ops.residual_norm(sub, residual, post_weight, next_weight, eps, mode=mode, residual_out=residual_out,
                             normed_out=normed_out, active_rows=active)


def check_tensor_parallel(config, size: int) -> None:
    """ConfigError unless the model's heads, K/V heads and MLP width divide evenly over `size` ranks."""
    fields = (("attention heads", config.num_heads), ("key/value heads", config.kv_heads),
              ("MLP width (intermediate_size)", config.intermediate_size))
    for what, value in fields:
        if value % size:
            raise ConfigError(f"tensor_parallel_size={size} must divide the model's {what} ({value}); "
                              f"choose a tensor_parallel_size that divides {value}")


@dataclass(frozen=True)
class RankSlices:
    """What one rank of `size` keeps of a block, as [start, stop) ranges within each checkpoint
    part: `q` (rows of q, and columns of the output projection), `kv` (rows of k and of v), `mlp`
    (rows of gate and of up, columns of down), `heads` and `kv_heads` (of Huginn's q/k biases).
    One rank (no tensor parallelism) keeps everything."""

    q: tuple[int, int]
    kv: tuple[int, int]
    mlp: tuple[int, int]
    heads: tuple[int, int]
    kv_heads: tuple[int, int]

    @classmethod
    def of(cls, tp: Optional[TensorParallel], heads: int, kv_heads: int, head_dim: int, width: int) -> "RankSlices":
        r, n = (tp.rank, tp.size) if tp is not None else (0, 1)
        h, kvh, f = heads // n, kv_heads // n, width // n
        return cls(q=(r * h * head_dim, (r + 1) * h * head_dim), kv=(r * kvh * head_dim, (r + 1) * kvh * head_dim),
                   mlp=(r * f, (r + 1) * f), heads=(r * h, (r + 1) * h), kv_heads=(r * kvh, (r + 1) * kvh))


def _rows(w, ranges):
    """The rows of a weight (tensor or Fp8Weight) in the given [start, stop) ranges, concatenated."""
    if isinstance(w, Fp8Weight):
        return Fp8Weight(_rows(w.data, ranges), _rows(w.scale, ranges), w.w8a8)
    return torch.cat([w[a:b] for a, b in ranges]).contiguous()


def _cols(w, cols: tuple[int, int]):
    """Columns [a, b) of a weight (an Fp8Weight keeps its per-output-row scales)."""
    a, b = cols
    if isinstance(w, Fp8Weight):
        return Fp8Weight(w.data[:, a:b].contiguous(), w.scale, w.w8a8)
    return w[:, a:b].contiguous()


def shifted(span: tuple[int, int], offset: int) -> tuple[int, int]:
    """[start, stop) moved by offset (a part's range within a fused weight)."""
    return span[0] + offset, span[1] + offset


def _shard_block(block, tp: TensorParallel, heads: int, kv_heads: int, head_dim: int, width: int, names) -> None:
    """Slice one attention + MLP block in place. names: the block's (qkv, out, gate_up, down) fields."""
    keep = RankSlices.of(tp, heads, kv_heads, head_dim, width)
    qkv, out, gate_up, down = names
    k0, v0 = heads * head_dim, (heads + kv_heads) * head_dim
    setattr(block, qkv, _rows(getattr(block, qkv), [keep.q, shifted(keep.kv, k0), shifted(keep.kv, v0)]))
    setattr(block, out, _cols(getattr(block, out), keep.q))
    setattr(block, gate_up, _rows(getattr(block, gate_up), [keep.mlp, shifted(keep.mlp, width)]))
    setattr(block, down, _cols(getattr(block, down), keep.mlp))
    if getattr(block, "q_bias", None) is not None:
        block.q_bias = block.q_bias[slice(*keep.heads)].contiguous()
    if getattr(block, "k_bias", None) is not None:
        block.k_bias = block.k_bias[slice(*keep.kv_heads)].contiguous()


def shard_model(model, tp: TensorParallel) -> None:
    """Keep only rank tp.rank's slice of a loaded Ouro or Huginn model (see module docstring)."""
    cfg = model.config
    check_tensor_parallel(cfg, tp.size)
    if cfg.family == "ouro":
        blocks, names = model.layers, ("wqkv", "wo", "w_gate_up", "w_down")
    else:
        blocks, names = model.prelude + model.core + model.coda_blocks, ("wqkv", "proj", "fc", "mlp_proj")
    for block in blocks:
        _shard_block(block, tp, cfg.num_heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate_size, names)
    model.heads, model.kv_heads, model.tp = cfg.num_heads // tp.size, cfg.kv_heads // tp.size, tp


NOT_WEIGHTS = ("config", "layout", "tp")  # model attributes that hold no tensors


def weight_tensors(model) -> list[torch.Tensor]:
    """Every tensor a loaded model holds: its attributes' tensors, and those inside lists and
    dataclasses (`Fp8Weight`s, layers, blocks)."""
    found: list[torch.Tensor] = []

    def walk(value) -> None:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name))

    for name, value in vars(model).items():
        if name not in NOT_WEIGHTS:
            walk(value)
    return found


def move_model(model, device) -> None:
    """Move a model's weights (tensors, `Fp8Weight`s, blocks, lists of blocks) to `device`: a rank
    loads and slices on the CPU, so its GPU only ever holds its shard."""
    device = torch.device(device)

    def move(value):
        if isinstance(value, torch.Tensor):
            return value.to(device)
        if isinstance(value, Fp8Weight):
            return Fp8Weight(value.data.to(device), value.scale.to(device), value.w8a8)
        if isinstance(value, list):
            return [move(v) for v in value]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                setattr(value, f.name, move(getattr(value, f.name)))
        return value

    for name, value in vars(model).items():
        if name not in NOT_WEIGHTS:
            setattr(model, name, move(value))
    model.device = device
