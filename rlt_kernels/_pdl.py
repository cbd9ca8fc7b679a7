"""Programmatic dependent launch (Hopper and newer): a kernel starts while its predecessor ends.

A kernel launched with ``launch_pdl=True`` may begin as soon as every program of the kernel
before it has passed `wait_for_inputs`; its own `wait_for_inputs` then blocks until that kernel
has finished and its writes are visible. The contract every rlt kernel keeps: before
`wait_for_inputs` a program reads and writes nothing, and every program calls it, also programs
that exit early — so a chain of such kernels keeps stream order exactly and results never change.
Only launches of at most one program per SM take it (a split decode attention counts its (token,
KV head) rows, not its range programs: attention.py). Every launch dependent was measured only
together with an L2 prefetch of the weights (docs/perf/kernels.md, 2026-12-01: the batch-256 step
within that run's 4% spread); without the prefetch it has not been measured. `RLT_PDL=0` turns it
off (plain stream order); under the interpreter and before Hopper it is off.
"""

from __future__ import annotations

import functools
import os

import torch

from ._triton import HAS_TRITON, interpreter_active, tl, triton

if HAS_TRITON:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@functools.lru_cache(maxsize=None)
def _pdl_programs(index: int) -> int:
    """Most programs a dependent launch may have on this device (0: the device has no PDL)."""
    if torch.cuda.get_device_capability(index)[0] < 9:
        return 0
    return torch.cuda.get_device_properties(index).multi_processor_count


def pdl_launch(t: torch.Tensor, programs: int) -> bool:
    """Whether a launch of ``programs`` programs writing on t's device is a dependent launch."""
    if t.device.type != "cuda" or interpreter_active() or os.environ.get("RLT_PDL", "1") == "0":
        return False
    return programs <= _pdl_programs(t.device.index if t.device.index is not None else torch.cuda.current_device())


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Block until the previous kernel has finished, then let the next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()

