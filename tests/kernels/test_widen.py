"""Exact FP8 widening (`rlt_kernels._widen`): every e4m3 value against torch's own cast, to bf16
(`widen_fp8`) and from int32 words to fp32 (`widen_fp8_words`, the decode attention's path).

On the GPU the inline PTX paths run; under the interpreter plain casts."""

import pytest
import torch

from rlt_kernels._triton import tl, triton
from rlt_kernels._widen import inline_widening, widen_fp8, widen_fp8_words
from rlt_kernels.fp8 import FP8_DTYPE

ROWS, COLS = 16, 256


@triton.jit
def _widen_kernel(src_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, INLINE: tl.constexpr):
    rows = tl.arange(0, ROWS)[:, None]
    x = tl.load(src_ptr + rows * COLS + tl.arange(0, COLS)[None, :])
    like = tl.zeros((ROWS, COLS), dtype=tl.bfloat16)
    tl.store(out_ptr + rows * COLS + tl.arange(0, COLS)[None, :], widen_fp8(x, like, INLINE))


def _all_values(device):
    """[ROWS, COLS] e4m3: each row a different rotation of the 256 bit patterns, NaN (0x7f, 0xff) made zero."""
    bits = torch.arange(256, dtype=torch.int32)
    bits = torch.where((bits & 0x7F) == 0x7F, 0, bits)
    table = torch.stack([torch.roll(bits, 17 * r) for r in range(ROWS)]).to(torch.uint8)
    return table.view(FP8_DTYPE).to(device)


def test_widening_is_exact_for_every_value(device):
    src = _all_values(device)
    out = torch.empty((ROWS, COLS), dtype=torch.bfloat16, device=device)
    _widen_kernel[(1,)](src, out, ROWS=ROWS, COLS=COLS, INLINE=inline_widening())
    expected = src.to(torch.bfloat16)
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16))  # -0 kept apart from +0


@triton.jit
def _widen_words_kernel(src_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, INLINE: tl.constexpr):
    rows = tl.arange(0, ROWS)[:, None, None]
    words = tl.arange(0, COLS // 4)[None, None, :]
    w = tl.load(src_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + rows * (COLS // 4) + words)
    cols = tl.arange(0, COLS)[None, None, :]
    tl.store(out_ptr + rows * COLS + cols, widen_fp8_words(w, INLINE))


def test_word_widening_is_exact_for_every_value_in_element_order(device):
    """Element 4 c + i of the widened row is byte i of word c, for every bit pattern in every byte
    position (the rows rotate the patterns), -0 included."""
    src = _all_values(device)
    out = torch.empty((ROWS, COLS), dtype=torch.float32, device=device)
    _widen_words_kernel[(1,)](src, out, ROWS=ROWS, COLS=COLS, INLINE=inline_widening())
    expected = src.to(torch.float32)
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))


@pytest.mark.gpu
def test_gpu_takes_the_integer_path(device):
    assert inline_widening()
