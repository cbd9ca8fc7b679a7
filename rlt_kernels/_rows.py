"""Row-invariant evaluation helpers for the torch references.

CPU BLAS and torch reductions pick different code paths for different row counts, so a row's
bits can depend on how many rows share the call. The references run row-wise work in chunks
of exactly ``ROW_CHUNK`` rows (zero padded), which makes every row's result independent of
its batch neighbours, its position and the batch size.
"""

from __future__ import annotations

from typing import Callable

import torch

ROW_CHUNK = 16


def by_row_chunks(fn: Callable[..., torch.Tensor], x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Apply ``fn(x_chunk, *args, **kwargs)`` to zero-padded chunks of ``ROW_CHUNK`` rows.

    x: [M, ...]; fn maps [ROW_CHUNK, ...] -> [ROW_CHUNK, ...]. Returns the concatenated first
    M rows.
    """
    m = x.shape[0]
    if m == 0:
        probe = fn(torch.zeros((ROW_CHUNK,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device), *args, **kwargs)
        return probe[:0]
    padded_m = -(-m // ROW_CHUNK) * ROW_CHUNK
    if padded_m != m:
        pad = torch.zeros((padded_m - m,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        x = torch.cat([x, pad])
    outs = [fn(x[i : i + ROW_CHUNK], *args, **kwargs) for i in range(0, padded_m, ROW_CHUNK)]
    return torch.cat(outs)[:m]


def active_count(active_rows: torch.Tensor | None, m: int) -> int:
    """Number of leading rows to process: ``min(m, active_rows[0])`` or ``m`` when None."""
    if active_rows is None:
        return m
    return max(0, min(m, int(active_rows.reshape(-1)[0].item())))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype of the references: fp64 stays fp64, everything else runs in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
