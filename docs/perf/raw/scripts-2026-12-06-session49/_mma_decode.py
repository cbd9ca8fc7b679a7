"""One warp's FP8 decode arithmetic on tensor cores: a query row against 16-key tiles of e4m3 K/V.

The CUDA-core decode loop widens every FP8 element to fp32 and multiplies it there: about 30
warp instructions a key at Ouro's 128-wide heads, which bounds full batch-256 launches by the
instructions they issue rather than by the bytes. Here each 16-key tile is two sets of `mma.sync`
m16n8k16 products (f16 operands, fp32 sums): the e4m3 bytes become f16 pairs in one exact hardware
conversion each and go straight into the product's fragments, about 12 instructions a key.

Fragments (lane = 4 g + t; every tensor is [32, 4], row = lane, four registers a lane, the layout
a load of four consecutive words gives, which inline assembly relies on):
* scores: A = the tile's K rows (row g and g + 8, a lane's 32 bytes 32 t .. 32 t + 31 of each key),
  B = q in every column, so a lane ends with the scores of keys g and g + 8. Each product's 16
  k-slots (2t, 2t + 1, 2t + 8, 2t + 9) are dimensions 32 t + 4 j .. + 3 of chunk j, the same
  permutation for K and q.
* values: C = V^T P, A = V^T (a lane's keys 2t, 2t + 1, 2t + 8, 2t + 9; dimensions 16 g .. 16 g +
  15, two a product), B = the tile's weights p in every column (moved from keys g, g + 8 to 2t .. by
  two shuffles). Product i sums dimensions 16 g + 2 i (out[:, 0], = out[:, 1]) and + 1 (out[:, 2]).

q enters the products in f16 (it is 16-bit already; a power-of-two shift keeps it in f16's
range), the weights p in f16, K and V exactly. Sums are fp32. Every row's arithmetic is its own,
so batch invariance holds as in the CUDA-core loop. Inline PTX needs sm_89 (e4m3 conversions); the
Triton interpreter runs the CUDA-core loop instead (`attention.decode_mma`).
"""

from __future__ import annotations

from ._triton import tl, triton

_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"


def _scores_asm() -> str:
    """$4-$11: key g's words 0..7 (its bytes 32 t ..), $12-$19: key g + 8's, $20-$35: q's f16 pairs
    (lo, hi) of chunks 0..7. Out: (score of key g, of key g + 8, 0, 0)."""
    body = [".reg .b16 al, ah, bl, bh;", ".reg .b32 r0, r1, r2, r3;", ".reg .f32 c0, c1, c2, c3, d0, d1, d2, d3;"]
    body += [f"mov.f32 {r}, 0f00000000;" for r in ("c0", "c1", "c2", "c3", "d0", "d1", "d2", "d3")]
    for j in range(8):  # chunks 0-3 and 4-7 in two chains of products, added at the end
        acc = "{c0, c1, c2, c3}" if j < 4 else "{d0, d1, d2, d3}"
        body += [f"mov.b32 {{al, ah}}, ${4 + j};", f"mov.b32 {{bl, bh}}, ${12 + j};",
                 "cvt.rn.f16x2.e4m3x2 r0, al;", "cvt.rn.f16x2.e4m3x2 r1, bl;",
                 "cvt.rn.f16x2.e4m3x2 r2, ah;", "cvt.rn.f16x2.e4m3x2 r3, bh;",
                 f"{_MMA} {acc}, {{r0, r1, r2, r3}}, {{${20 + 2 * j}, ${21 + 2 * j}}}, {acc};"]
    body += ["add.rn.f32 $0, c0, d0;", "add.rn.f32 $1, c2, d2;", "mov.f32 $2, 0f00000000;", "mov.f32 $3, 0f00000000;"]
    return "{\n" + "\n".join(body) + "\n}"


def _values_asm(i: int) -> str:
    """Product i of the values: $4-$19 the words of keys 2t, 2t + 1, 2t + 8, 2t + 9 (dimensions 16 g
    ..), $20, $21 the weights' f16 pairs, $24-$27 the running sums; out: the new sums."""
    sel = "0x5140" if i % 2 == 0 else "0x7362"  # bytes 2i, 2i + 1 of two keys' word, interleaved
    w = i // 2
    body = [".reg .b32 x, y, a0, a1, a2, a3;", ".reg .b16 xl, xh, yl, yh;",
            f"prmt.b32 x, ${4 + w}, ${8 + w}, {sel};", f"prmt.b32 y, ${12 + w}, ${16 + w}, {sel};",
            "mov.b32 {xl, xh}, x;", "mov.b32 {yl, yh}, y;",
            "cvt.rn.f16x2.e4m3x2 a0, xl;", "cvt.rn.f16x2.e4m3x2 a1, xh;",
            "cvt.rn.f16x2.e4m3x2 a2, yl;", "cvt.rn.f16x2.e4m3x2 a3, yh;",
            f"{_MMA} {{$0, $1, $2, $3}}, {{a0, a1, a2, a3}}, {{$20, $21}}, {{$24, $25, $26, $27}};"]
    return "{\n" + "\n".join(body) + "\n}"


_SCORES = tl.constexpr(_scores_asm())
_SCORES_CONSTRAINTS = tl.constexpr("=f,=f,=f,=f," + ",".join(["r"] * 32))
_VALUES_CONSTRAINTS = tl.constexpr("=f,=f,=f,=f," + ",".join(["r"] * 20) + ",f,f,f,f")
_V0, _V1, _V2, _V3, _V4, _V5, _V6, _V7 = (tl.constexpr(_values_asm(i)) for i in range(8))
# Two chunks of q (4 fp32 each) -> their (lo, hi) f16 pairs.
_Q_PAIRS = tl.constexpr("cvt.rn.f16x2.f32 $0, $5, $4;\ncvt.rn.f16x2.f32 $1, $7, $6;\n"
                        "cvt.rn.f16x2.f32 $2, $9, $8;\ncvt.rn.f16x2.f32 $3, $11, $10;")
# Weights of keys (g, g + 8) in $4, $5 -> the values' B operand (p[2t], p[2t + 1]), (p[2t + 8], p[2t + 9]).
_WEIGHTS = tl.constexpr("""{
.reg .b32 w, w1, w2, src;
cvt.rn.f16x2.f32 w, $5, $4;
mov.u32 src, %laneid;
and.b32 src, src, 3;
shl.b32 src, src, 3;
shfl.sync.idx.b32 w1, w, src, 0x1f, 0xffffffff;
add.u32 src, src, 4;
shfl.sync.idx.b32 w2, w, src, 0x1f, 0xffffffff;
prmt.b32 $0, w1, w2, 0x5410;
prmt.b32 $1, w1, w2, 0x7632;
mov.b32 $2, 0;
mov.b32 $3, 0;
}""")


@triton.jit
def lanes():
    """(g, t, c): lane // 4 and lane % 4 as [32, 1], the register index as [1, 4]."""
    lane = tl.arange(0, 32)[:, None]
    return lane // 4, lane % 4, tl.arange(0, 4)[None, :]


@triton.jit
def _q_pairs(a, b):
    return tl.inline_asm_elementwise(_Q_PAIRS, "=r,=r,=r,=r,f,f,f,f,f,f,f,f", [a, b], dtype=tl.int32, is_pure=True,
                                     pack=4)


@triton.jit
def q_fragments(row_ptr, t, c):
    """q's B operands from its 128 values at row_ptr (16-bit): four [32, 4] int32 tensors (chunk
    pairs), and the power of two the scores are to be multiplied by (q is divided by it, exactly,
    when its largest magnitude would leave f16's range)."""
    base = row_ptr + 32 * t + c
    q0 = tl.load(base).to(tl.float32)
    q1 = tl.load(base + 4).to(tl.float32)
    q2 = tl.load(base + 8).to(tl.float32)
    q3 = tl.load(base + 12).to(tl.float32)
    q4 = tl.load(base + 16).to(tl.float32)
    q5 = tl.load(base + 20).to(tl.float32)
    q6 = tl.load(base + 24).to(tl.float32)
    q7 = tl.load(base + 28).to(tl.float32)
    big = tl.maximum(tl.maximum(tl.maximum(tl.abs(q0), tl.abs(q1)), tl.maximum(tl.abs(q2), tl.abs(q3))),
                     tl.maximum(tl.maximum(tl.abs(q4), tl.abs(q5)), tl.maximum(tl.abs(q6), tl.abs(q7))))
    big = tl.max(tl.max(big, 1), 0)
    # shift = floor(log2(big)) - 14 where big >= 2^15 (the exponent field, exactly), else 0
    shift = tl.where(big >= 32768.0, ((big.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127 - 14, 0)
    down = ((127 - shift) << 23).to(tl.float32, bitcast=True)
    up = ((127 + shift) << 23).to(tl.float32, bitcast=True)
    return (_q_pairs(q0 * down, q1 * down), _q_pairs(q2 * down, q3 * down), _q_pairs(q4 * down, q5 * down),
            _q_pairs(q6 * down, q7 * down), up)


@triton.jit
def tile_scores(ka0, ka1, kb0, kb1, q01, q23, q45, q67):
    """[32, 4] fp32: (q . K[key g], q . K[key g + 8], 0, 0) of a 16-key tile; ka*/kb* the lane's
    words of keys g and g + 8 (words 0-3, 4-7 of its 32 bytes)."""
    return tl.inline_asm_elementwise(_SCORES, _SCORES_CONSTRAINTS, [ka0, ka1, kb0, kb1, q01, q23, q45, q67],
                                     dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def _values(v0, v1, v2, v3, pb, acc, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, _VALUES_CONSTRAINTS, [v0, v1, v2, v3, pb, acc], dtype=tl.float32,
                                     is_pure=True, pack=4)


@triton.jit
def tile_values(v0, v1, v2, v3, p, o0, o1, o2, o3, o4, o5, o6, o7):
    """The running sums o0..o7 plus the tile's weights p (from `tile_scores`' layout) times its V;
    v0..v3: the lane's words of keys 2t, 2t + 1, 2t + 8, 2t + 9 (dimensions 16 g .. 16 g + 15)."""
    pb = tl.inline_asm_elementwise(_WEIGHTS, "=r,=r,=r,=r,f,f,f,f", [p], dtype=tl.int32, is_pure=True, pack=4)
    return (_values(v0, v1, v2, v3, pb, o0, _V0), _values(v0, v1, v2, v3, pb, o1, _V1),
            _values(v0, v1, v2, v3, pb, o2, _V2), _values(v0, v1, v2, v3, pb, o3, _V3),
            _values(v0, v1, v2, v3, pb, o4, _V4), _values(v0, v1, v2, v3, pb, o5, _V5),
            _values(v0, v1, v2, v3, pb, o6, _V6), _values(v0, v1, v2, v3, pb, o7, _V7))
