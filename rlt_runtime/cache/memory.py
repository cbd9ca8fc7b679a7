"""Capacity planning: how many KV blocks the pool gets, recorded as a plan the engine prints.

Explicit `num_blocks` or `kv_cache_memory_bytes` win (mutually exclusive). Otherwise on CUDA the
planner measures the peak memory of the largest step (a profiling run at the biggest decode bucket
and the full token budget), subtracts weights, that peak, the CUDA-graph pools and a fixed reserve
from `gpu_memory_utilization` of the device memory, and sizes the pool from what is left. On CPU
the default is small. The pool is capped at the blocks every running request could use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch

from ..errors import ConfigError

CPU_DEFAULT_KV_BYTES = 256 << 20
RESERVE_BYTES = 256 << 20


@dataclass
class MemoryPlan:
    num_blocks: int
    block_bytes: int
    source: str  # "num_blocks" | "kv_cache_memory_bytes" | "profiled" | "cpu-default"
    useful_blocks: int
    total_bytes: Optional[int] = None
    weights_bytes: Optional[int] = None
    peak_activation_bytes: Optional[int] = None
    graph_reserve_bytes: Optional[int] = None
    reserve_bytes: Optional[int] = None

    def describe(self) -> str:
        gib = lambda b: "n/a" if b is None else f"{b / 2**30:.2f} GiB"  # noqa: E731
        return (f"KV cache: {self.num_blocks} blocks x {self.block_bytes / 2**20:.2f} MiB ({self.source}); "
                f"device {gib(self.total_bytes)}, weights {gib(self.weights_bytes)}, "
                f"activation peak {gib(self.peak_activation_bytes)}, graphs {gib(self.graph_reserve_bytes)}")

    def as_dict(self) -> dict:
        return asdict(self)


def block_bytes(num_cache_layers: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one block (one plane, all cache layers, K and V)."""
    return 2 * num_cache_layers * block_size * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def plan_kv_cache(cfg, *, device: torch.device, per_block: int, useful_blocks: int, weights_bytes: int,
                  profile_peak: Callable[[], int], graph_reserve_bytes: int = 0) -> MemoryPlan:
    """Choose the pool size (see module docstring). `profile_peak()` returns the step's peak bytes."""
    if cfg.num_blocks is not None:
        return MemoryPlan(cfg.num_blocks, per_block, "num_blocks", useful_blocks)
    if cfg.kv_cache_memory_bytes is not None:
        n = cfg.kv_cache_memory_bytes // per_block
        if n < 1:
            raise ConfigError(f"kv_cache_memory_bytes ({cfg.kv_cache_memory_bytes}) is smaller than one block ({per_block} bytes)")
        return MemoryPlan(int(n), per_block, "kv_cache_memory_bytes", useful_blocks)
    if device.type != "cuda":
        n = max(1, min(useful_blocks, CPU_DEFAULT_KV_BYTES // per_block))
        return MemoryPlan(n, per_block, "cpu-default", useful_blocks)
    total = torch.cuda.get_device_properties(device).total_memory
    peak = profile_peak()
    budget = int(total * cfg.gpu_memory_utilization) - weights_bytes - peak - graph_reserve_bytes - RESERVE_BYTES
    free_now = torch.cuda.mem_get_info(device)[0] - RESERVE_BYTES
    budget = min(budget, free_now - peak - graph_reserve_bytes)
    n = min(useful_blocks, budget // per_block)
    if n < 1:
        raise ConfigError(
            f"no memory left for the KV cache: gpu_memory_utilization={cfg.gpu_memory_utilization} of "
            f"{total / 2**30:.1f} GiB minus weights {weights_bytes / 2**30:.2f} GiB and peak {peak / 2**30:.2f} GiB; "
            "raise gpu_memory_utilization or lower max_num_seqs / max_num_batched_tokens"
        )
    return MemoryPlan(int(n), per_block, "profiled", useful_blocks, total, weights_bytes, peak, graph_reserve_bytes, RESERVE_BYTES)
