"""The one matrix product every rlt kernel uses, with the interpreter's arithmetic made row-exact.

On the GPU `mma` is `tl.dot` with fp32 accumulation. Under the Triton interpreter `tl.dot` is a
numpy matmul, which multiplies bf16 bit patterns as integers, and whose fp32 BLAS rounds a row
differently depending on the matrix around it; there (EXACT) the product is taken in fp64 (exact
products, sums far below fp32's rounding) and rounded once to fp32 before it is added to the
accumulator, so a row's result depends only on that row, as the kernels' batch invariance needs.
"""

from __future__ import annotations

from ._triton import interpreter_active, tl, triton


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr, EXACT: tl.constexpr):
    """acc + a @ b in fp32 (acc None: a @ b). a [M, K], b [K, N]; PRECISION "ieee" or "tf32"."""
    if EXACT:
        prod = tl.dot(a.to(tl.float64), b.to(tl.float64), input_precision="ieee").to(tl.float32)
        if acc is None:
            return prod
        return acc + prod
    return tl.dot(a, b, acc, input_precision=PRECISION)


def exact_dots() -> bool:
    """Whether kernels must take their dots with `mma`'s EXACT path (under the interpreter)."""
    return interpreter_active()
