"""Exact FP8 (e4m3) to bf16 widening in integer instructions, for kernels that read FP8 tiles.

`tl.cast` lowers e4m3 -> bf16 on sm_90 as e4m3x2 -> f16x2 and then one f16 -> bf16 conversion per
element (F2F, a slow conversion-pipe instruction); in a decode GEMV over FP8 weights those, not
the memory, set the pace. The bit pattern of an e4m3 value b placed into a bf16 (sign to bit 15,
the 7 exponent-and-mantissa bits to bits 4..10) is the same value times 2^-120, for normal and
subnormal e4m3 alike; one exact bf16x2 multiply by 2^120 restores it. So four FP8 values cost two
byte permutes, two shifts, four logic ops and two bf16x2 multiplies (H200, Ouro qkv at M = 1: 14.3
-> 11.0 us, same bits). NaN (0x7f / 0xff) would come out as +-480; FP8 tensors made by
`rlt_kernels.fp8` never hold NaN (values are clamped to +-448).

Under the Triton interpreter (no inline PTX) the plain cast is taken; both give the same values.
"""

from __future__ import annotations

from ._triton import interpreter_active, tl, triton

# $0, $1: four bf16 (two per register) from $2: four e4m3 bytes (element 0 in byte 0).
_E4M3X4_TO_BF16X4 = tl.constexpr("""
{
.reg .b32 lo, hi, m, s, scale, nzero;
mov.b32 scale, 0x7B807B80;
mov.b32 nzero, 0x80008000;
prmt.b32 lo, $2, 0, 0x1404;
prmt.b32 hi, $2, 0, 0x3424;
shr.b32 m, lo, 4;
and.b32 m, m, 0x07F007F0;
and.b32 s, lo, 0x80008000;
or.b32 m, m, s;
fma.rn.bf16x2 $0, m, scale, nzero;
shr.b32 m, hi, 4;
and.b32 m, m, 0x07F007F0;
and.b32 s, hi, 0x80008000;
or.b32 m, m, s;
fma.rn.bf16x2 $1, m, scale, nzero;
}
""")


@triton.jit
def widen_fp8(x, like, INLINE: tl.constexpr):
    """The float8e4nv tile ``x`` in ``like``'s dtype, exactly: with INLINE and a bf16 ``like`` the
    integer path above, else the plain cast (fp16 / fp32 targets, the interpreter)."""
    if INLINE and like.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(_E4M3X4_TO_BF16X4, "=r,=r,r", [x.to(tl.uint8, bitcast=True)],
                                         dtype=tl.bfloat16, is_pure=True, pack=4)
    return x.to(like.dtype)


# $0..$3: four fp32 from $4: one 32-bit word of four e4m3 bytes (element 0 in byte 0). Two hardware
# e4m3x2 -> f16x2 conversions and four f16 -> f32 ones, all exact, with no byte shuffling.
_E4M3X4_WORD_TO_F32X4 = tl.constexpr("""
{
.reg .b16 lo, hi, a0, a1, a2, a3;
.reg .b32 h01, h23;
mov.b32 {lo, hi}, $4;
cvt.rn.f16x2.e4m3x2 h01, lo;
cvt.rn.f16x2.e4m3x2 h23, hi;
mov.b32 {a0, a1}, h01;
mov.b32 {a2, a3}, h23;
cvt.f32.f16 $0, a0;
cvt.f32.f16 $1, a1;
cvt.f32.f16 $2, a2;
cvt.f32.f16 $3, a3;
}
""")


@triton.jit
def _word_byte(w, i: tl.constexpr):
    """Byte i of each int32 word of ``w`` as an e4m3 value in fp32 (the interpreter's path)."""
    return ((w >> (8 * i)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def widen_fp8_words(w, INLINE: tl.constexpr):
    """FP8 (e4m3) data read as int32 words, ``w`` [A, B, C], widened exactly to fp32 [A, B, 4 C]:
    element 4 c + i is byte i of word c. Reading an FP8 tile as words and widening each word in
    registers spares the per-byte unpacking and repacking a float8 tile's cast costs on sm_90."""
    if INLINE:
        e0, e1, e2, e3 = tl.inline_asm_elementwise(_E4M3X4_WORD_TO_F32X4, "=r,=r,=r,=r,r", [w],
                                                   dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
                                                   is_pure=True, pack=1)
    else:
        e0, e1, e2, e3 = _word_byte(w, 0), _word_byte(w, 1), _word_byte(w, 2), _word_byte(w, 3)
    # [.., c, b, a] = byte 2 b + a of word c, so the row-major flattening puts byte i at 4 c + i.
    x = tl.join(tl.join(e0, e2), tl.join(e1, e3))
    return tl.reshape(x, (w.shape[0], w.shape[1], 4 * w.shape[2]))


def inline_widening() -> bool:
    """Whether kernels may take `widen_fp8`'s inline-PTX path (not under the interpreter)."""
    return not interpreter_active()
