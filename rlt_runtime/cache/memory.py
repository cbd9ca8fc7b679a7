"""Capacity planning: how many KV blocks the pool gets, recorded as a plan the engine prints.

Explicit `num_blocks` or `kv_cache_memory_bytes` win (mutually exclusive). Otherwise on CUDA the
planner measures the peak memory of the largest step (a profiling run at the biggest decode bucket
and the full token budget), subtracts weights, the per-slot logit-processing state (the penalties'
[max_num_seqs, vocab] counts and prompt mask, allocated with the runner after the weights were
measured), that peak, the CUDA-graph pools and a fixed reserve from `gpu_memory_utilization` of
the device memory, and sizes the pool from what is left. On CPU
the default is small. The pool is capped at the blocks every running request could use.

Before anything is allocated, `check_context_fits` sizes what the context length alone decides,
the RoPE table and the block tables, against the memory the device has left next to the weights:
a config's `max_position_embeddings` of 10**12 fails with a ConfigError naming it and the largest
`max_model_len` that fits, not an allocator error.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch

from ..errors import ConfigError

CPU_DEFAULT_KV_BYTES = 256 << 20
RESERVE_BYTES = 256 << 20
# rlt_kernels.norms.rope_cos_sin concatenates its fp32 [positions, head_dim] table from angle, cos
# and sin temporaries (half its size each) while fp32 positions [positions] live: 2.5x the table
# plus 4 bytes a position, at most 3x the table for any even head_dim.
ROPE_BUILD_PEAK = 3


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
    state_bytes: Optional[int] = None  # per-slot logit-processing state (penalty counts, prompt mask, ...)

    def describe(self) -> str:
        gib = lambda b: "n/a" if b is None else f"{b / 2**30:.2f} GiB"  # noqa: E731
        return (f"KV cache: {self.num_blocks} blocks x {self.block_bytes / 2**20:.2f} MiB ({self.source}); "
                f"device {gib(self.total_bytes)}, weights {gib(self.weights_bytes)}, "
                f"per-slot state {gib(self.state_bytes)}, activation peak {gib(self.peak_activation_bytes)}, "
                f"graphs {gib(self.graph_reserve_bytes)}")

    def as_dict(self) -> dict:
        return asdict(self)


def block_bytes(num_cache_layers: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one block (one plane, all cache layers, K and V) with K/V in `dtype` (1 byte an
    element for float8_e4m3fn; the FP8 scales live outside the pool)."""
    return 2 * num_cache_layers * block_size * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def plan_kv_cache(cfg, *, device: torch.device, per_block: int, useful_blocks: int, weights_bytes: int,
                  profile_peak: Callable[[], int], graph_reserve_bytes: int = 0, state_bytes: int = 0) -> MemoryPlan:
    """Choose the pool size (see module docstring). `profile_peak()` returns the step's peak bytes;
    state_bytes: persistent per-slot state outside weights_bytes and the peak (set aside)."""
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
    budget = (int(total * cfg.gpu_memory_utilization) - weights_bytes - state_bytes - peak - graph_reserve_bytes
              - RESERVE_BYTES)
    free_now = torch.cuda.mem_get_info(device)[0] - RESERVE_BYTES
    budget = min(budget, free_now - peak - graph_reserve_bytes)
    n = min(useful_blocks, budget // per_block)
    if n < 1:
        raise ConfigError(
            f"no memory left for the KV cache: gpu_memory_utilization={cfg.gpu_memory_utilization} of "
            f"{total / 2**30:.1f} GiB minus weights {weights_bytes / 2**30:.2f} GiB, per-slot state "
            f"{state_bytes / 2**30:.2f} GiB and peak {peak / 2**30:.2f} GiB; raise gpu_memory_utilization, lower "
            "max_num_seqs / max_num_batched_tokens or set enable_penalties=False"
        )
    return MemoryPlan(int(n), per_block, "profiled", useful_blocks, total, weights_bytes, peak, graph_reserve_bytes,
                      RESERVE_BYTES, state_bytes)


def context_table_bytes(max_model_len: int, *, head_dim: int, num_planes: int, num_slots: int, block_size: int) -> int:
    """Peak bytes of the RoPE table (fp32 [max_model_len, head_dim], with its build temporaries) and
    the block tables (int32 [num_planes, num_slots, ceil(max_model_len / block_size)])."""
    blocks_per_seq = -(-max_model_len // block_size)
    return ROPE_BUILD_PEAK * max_model_len * head_dim * 4 + num_planes * num_slots * blocks_per_seq * 4


def available_bytes(device: torch.device) -> int:
    """Memory an allocation on `device` can take now: free CUDA memory plus this process's cached
    blocks; on the host, MemAvailable (/proc/meminfo) or else the physical memory."""
    if device.type == "cuda":
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + cached
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_context_fits(max_model_len: int, *, origin: str, head_dim: int, num_planes: int, num_slots: int,
                       block_size: int, weights_bytes: int, device: torch.device) -> None:
    """Raise ConfigError unless the RoPE and block tables of `max_model_len` fit on `device` next to
    the weights (and RESERVE_BYTES). `origin` says where max_model_len came from (a config.json
    field or the option); the error names it and the largest max_model_len that fits."""
    need = context_table_bytes(max_model_len, head_dim=head_dim, num_planes=num_planes, num_slots=num_slots,
                               block_size=block_size)
    free = available_bytes(device)
    left = free - weights_bytes - RESERVE_BYTES
    if need <= left:
        return
    per_block = context_table_bytes(block_size, head_dim=head_dim, num_planes=num_planes, num_slots=num_slots,
                                    block_size=block_size)
    fits = max(0, left) // per_block * block_size
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    advice = (f"set max_model_len to at most {fits} or lower max_num_seqs" if fits else
              "the weights leave no room: free memory on the device or use a smaller dtype")
    raise ConfigError(
        f"max_model_len = {max_model_len} ({origin}) needs {gib(need)} for the RoPE table and the block tables "
        f"of {num_slots} sequences, but {device} has {gib(free)} available, {gib(weights_bytes)} of it for the "
        f"weights and {gib(RESERVE_BYTES)} kept in reserve; {advice}")
