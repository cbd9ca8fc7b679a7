"""The fp32 partial sums of a split-K `linear`, handed to a consumer that adds them itself.

A weight whose reduction plan splits K (`gemm.linear_config(...).split_k > 1`) produces one fp32
partial product per K range. `gemm.linear` adds them in range order in a second kernel;
`gemm.linear_partials` stops before that and returns them as `SplitPartials`, and
`norms.residual_norm` accepts them in place of its ``sub`` input, doing the very same sum,
per-channel scale and rounding in its own kernel (same bits, one launch and one round trip fewer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class SplitPartials:
    """workspace: fp32 [splits, M, N] (range s of row m at [s, m]); scale: fp32 [N] (FP8 weights'
    per-channel scales, applied after the sum) or None; dtype: what the sum rounds to (the
    linear's output dtype); row_scale: fp32 [M] (FP8 input rows' scales, applied after the
    channel scales) or None. Rows at or past the launch's active count hold garbage."""

    workspace: torch.Tensor
    scale: Optional[torch.Tensor]
    dtype: torch.dtype
    row_scale: Optional[torch.Tensor] = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.workspace.shape[1], self.workspace.shape[2])

    @property
    def splits(self) -> int:
        return self.workspace.shape[0]
