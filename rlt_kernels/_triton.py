"""Triton import guard shared by every kernel module.

Kernels are written against `triton` / `triton.language`. Where Triton is not installed
(non-Linux hosts), the modules still import: the torch references keep working and a kernel
launch raises a clear error. On a machine without CUDA, kernels run under the Triton
interpreter when ``TRITON_INTERPRET=1`` is set before Triton is imported.

Every launch states ``enable_fp_fusion``: True (a * b + c contracted into one FMA, Triton's default
up to 3.9, which 3.10 turns off unless a launch asks) for the kernels whose bits, speed and GPU tests
were established that way; False for those that must round as their torch references do.
"""

from __future__ import annotations

import os

import torch

try:  # pragma: no cover - exercised implicitly on every import
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    HAS_TRITON = True
except ImportError:  # pragma: no cover - only on hosts without triton
    HAS_TRITON = False

    class _Missing:
        """Stands in for `triton` / `triton.language` so kernel definitions still parse."""

        constexpr = object
        dtype = object

        def __getattr__(self, name):
            return _Missing()

        def __call__(self, *args, **kwargs):
            if args and callable(args[0]) and len(args) == 1 and not kwargs:
                return _MissingKernel(args[0].__name__)
            return _MissingKernel("triton")

    class _MissingKernel:
        def __init__(self, name):
            self.name = name

        def __call__(self, fn):  # `@triton.jit(...)` with options applies the result to the function
            return _MissingKernel(getattr(fn, "__name__", "triton"))

        def __getitem__(self, grid):
            raise RuntimeError(
                f"Triton kernel {self.name!r} needs the 'triton' package; install it or use the "
                "torch reference (rlt_kernels.reference)"
            )

    triton = _Missing()
    tl = _Missing()
    TensorDescriptor = _Missing()


def interpreter_active() -> bool:
    """True when Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_launchable(*tensors: torch.Tensor) -> None:
    """Raise a clear error when a Triton kernel cannot run on these tensors' device."""
    if not HAS_TRITON:
        raise RuntimeError("rlt_kernels Triton kernels need the 'triton' package")
    for t in tensors:
        if t is None:
            continue
        if t.device.type != "cuda" and not interpreter_active():
            raise RuntimeError(
                f"tensor on {t.device} given to a Triton kernel: use CUDA tensors, set "
                "TRITON_INTERPRET=1 before importing triton, or call the torch reference "
                "(rlt_kernels.reference)"
            )


__all__ = ["triton", "tl", "TensorDescriptor", "HAS_TRITON", "interpreter_active", "check_launchable"]
