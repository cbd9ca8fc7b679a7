"""Programmatic dependent launch (Hopper and newer): a kernel starts while its predecessor ends.

A kernel launched with ``launch_pdl=True`` may begin as soon as every program of the kernel
before it has passed `wait_for_inputs`; its own `wait_for_inputs` then blocks until that kernel
has finished and its writes are visible. The contract every rlt kernel keeps: before
`wait_for_inputs` a program reads and writes nothing, and every program calls it, also programs
that exit early — so a chain of such kernels keeps stream order exactly and results never change.
Every launch takes it, whatever its size. Against launches of at most one program per SM only (the
former rule), on an H100 (docs/perf/fp8.md, 2026-12-06) the batch-256 decode step went from 13.79
to 13.26 ms with W8A8 + FP8 K/V and from 21.68 to 21.22 ms in bf16; batch 1 was unchanged.
A multi-wave dependent launch cannot deadlock: the next kernel starts only once every program of
this one has passed `wait_for_inputs`, so all of them are resident or done. `RLT_PDL=0` turns it
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
def _has_pdl(index: int) -> bool:
    """Whether CUDA device ``index`` launches dependently (Hopper and newer)."""
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_launch(t: torch.Tensor) -> bool:
    """Whether a launch writing on t's device is a dependent launch."""
    if t.device.type != "cuda" or interpreter_active() or os.environ.get("RLT_PDL", "1") == "0":
        return False
    return _has_pdl(t.device.index if t.device.index is not None else torch.cuda.current_device())


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Block until the previous kernel has finished, then let the next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()

