"""Offline sm_90 (Triton 3.6) key-loop instruction counts: the tile kernel with 16-row tiles (one
query row of Ouro MHA per tile) against the decode kernel, FP8 and bf16 caches.
    PYTHONPATH=/tmp/t36:. python scratch/s39_tile16_sass.py"""
import torch
from perf import sm90_resources as R
from rlt_kernels import attention


def tile(cache, qdt="bf16", block_m=16, block_n=64, warps=4, stages=1, key_depth=False):
    ptrs, flags = R._attention_signature(cache)
    ptrs = dict(ptrs, q_ptr="*" + qdt, out_ptr="*" + qdt)
    flags["HAS_KEY_DEPTH"] = key_depth
    const = dict(GROUP=1, GP=1, QPT=block_m, BLOCK_M=block_m, HEAD_DIM=128, DP=128, BLOCK_N=block_n,
                 DOT_PRECISION="tf32", EXACT_DOT=False, WIDEN_INLINE=True, **flags)
    return R.compile_sm90(attention._paged_attention_kernel, ptrs, const, floats=("qk_scale",), num_warps=warps,
                          num_stages=stages, key_loop=True)


def show(name, rep, keys_per_lap, warps):
    loop = rep.get("key_loop", {})
    n = loop.get("instructions")
    per_key = n * warps / keys_per_lap if n else None
    print(f"{name:40s} regs {rep.get('registers')} stack {rep.get('stack_bytes')} smem {rep.get('shared_bytes')} "
          f"loop {n} -> {per_key and round(per_key, 1)} warp-instr/key  {rep.get('error', '')}")
    print("   ", loop.get("ops"))


for kd in (False, True):
    rep = R.decode_attention_report("fp8", split=False, key_depth=kd, key_loop=True, max_registers=96)
    show(f"decode fp8 kd={kd}", rep, 32, 4)
    rep = R.decode_attention_report("bf16", split=False, key_depth=kd, key_loop=True)
    show(f"decode bf16 kd={kd}", rep, 16, 4)
    for cache, qdt in (("fp8", "bf16"), ("fp8", "fp16"), ("bf16", "bf16")):
        for bn, w in ((64, 4), (32, 4), (128, 4), (64, 2), (64, 8)):
            show(f"tile16 {cache} q{qdt} n{bn} w{w} kd={kd}", tile(cache, qdt, block_n=bn, warps=w, key_depth=kd), bn, w)
