"""Compile the hot kernels for the H200 (sm_90) without a GPU and report their resources.

`small_smem_linear_reports` compiles the linear kernel's tiles for a GPU with 99 KiB of shared memory
per program (sm_89: RTX 4090, L40S, L4) as `gemm.linear_config` picks them there.

    python -m perf.sm90_resources            # with the installed Triton
    PYTHONPATH=/path/to/triton-3.6:. python -m perf.sm90_resources   # with the GPU image's Triton

Each kernel is compiled from source for `GPUTarget("cuda", 90, 32)` with the constexprs the engine
launches it with and the 16-byte divisibility a real launch specialises pointers and strides to
(without it Triton cannot use cp.async and the pipeline report is meaningless). Prints registers,
spill (stack bytes) and shared memory per kernel configuration, read with the `cuobjdump` that
ships with Triton. A compiler failure is reported, not raised: this is how a construct that one
Triton version cannot lower is caught before any GPU time is spent.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from rlt_kernels import attention, gemm
from rlt_kernels.fp8 import FP8_DTYPE

TARGET = GPUTarget("cuda", 90, 32)
# Global-memory reads counted in each kernel's PTX: 16-byte vectors, 2-byte elements, 16-byte async
# copies, tensor-memory-accelerator copies.
GLOBAL_LOADS = ("ld.global.v4.b32", "ld.global.b16", "cp.async.cg.shared.global", "cp.async.bulk.tensor")
# FP8 widening in the PTX: Triton's cast to bf16 (one f16 -> bf16 conversion per element), the integer
# path of rlt_kernels/_widen.py (its exact bf16x2 multiply), the hardware e4m3x2 conversions, and the
# per-byte unpacking and repacking of a float8 tile's cast (what reading FP8 as words avoids).
WIDENING = ("cvt.bf16.f16", "fma.rn.bf16x2", "cvt.rn.f16x2.e4m3x2", "prmt.b32", "cvt.u16.u32")
# fp32 adds, multiplies and FMAs that flush subnormals (".ftz"; libdevice's round-to-nearest operations
# compile to them): a kernel whose bits must equal a reference's, or a kernel compiled without
# contraction, must have none.
FLUSHING_ARITHMETIC = re.compile(r"\b(?:add|sub|mul|fma)(?:\.r[nzmp])?\.ftz(?:\.sat)?\.f32\b")
OURO_WEIGHTS = [("qkv", 6144, 2048, None), ("o", 2048, 2048, None), ("gate_up", 11264, 2048, "swiglu"),
                ("down", 2048, 5632, None), ("lm_head", 49152, 2048, None)]


def _cuobjdump(cubin: bytes, option: str) -> str:
    """The output of the `cuobjdump` that ships with Triton, run with `option` on `cubin`."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, option, f.name], capture_output=True, text=True).stdout


def _resources(cubin: bytes) -> dict:
    found = re.search(r"REG:(\d+) STACK:(\d+)", _cuobjdump(cubin, "--dump-resource-usage"))
    return {"registers": int(found.group(1)), "stack_bytes": int(found.group(2))} if found else {}


def _innermost_loop(cubin: bytes) -> dict:
    """The SASS of the innermost loop of more than 50 instructions (a backward branch's span):
    its instruction count, its 12 most frequent opcodes (predicates dropped), its local-memory
    (spill) instructions, and the whole kernel's instruction and local-memory counts (what a warp
    issues once, outside the loop, is the difference)."""
    sass = [(int(m.group(1), 16), m.group(2).strip())
            for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", _cuobjdump(cubin, "-sass"))]
    loops = [(int(m.group(1), 16), addr) for addr, text in sass
             for m in [re.search(r"BRA.*?0x([0-9a-f]+)", text)] if m and int(m.group(1), 16) < addr]
    start, end = min((loop for loop in loops if (loop[1] - loop[0]) // 16 > 50), key=lambda loop: loop[1] - loop[0])
    body = [re.sub(r"^@!?U?P\w+\s+", "", text).split()[0] for addr, text in sass if start <= addr <= end]
    local = [addr for addr, text in sass if re.search(r"\b(STL|LDL)", text)]
    return {"instructions": len(body), "ops": collections.Counter(body).most_common(12),
            "local_memory": sum(start <= addr <= end for addr in local),
            "kernel_instructions": len(sass), "kernel_local_memory": len(local)}


def compile_sm90(fn, pointers: dict, constexprs: dict, floats=(), target=TARGET, key_loop=False, **options) -> dict:
    """Compile `fn` for sm_90: `pointers` maps pointer arguments to Triton types; every other
    non-constexpr argument is i32 (fp32 if in `floats`) and, like pointers, 16-byte divisible
    unless the kernel opts out of specialising it (`do_not_specialize`). FMA contraction is on, as
    rlt launches every kernel but those that round as their references (pass enable_fp_fusion=False).
    `key_loop`: the report also reads the innermost loop's SASS (`_innermost_loop`)."""
    names = fn.arg_names
    signature = {n: pointers.get(n) or ("constexpr" if n in constexprs else "fp32" if n in floats else "i32")
                 for n in names}
    plain = set(constexprs) | set(floats) | set(getattr(fn, "do_not_specialize", ()))
    divisible = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n not in plain}
    src = ASTSource(fn=fn, signature=signature, constexprs={(names.index(n),): v for n, v in constexprs.items()},
                    attrs=divisible)
    try:
        kernel = triton.compile(src, target=target, options={"enable_fp_fusion": True, **options})
    except Exception as exc:  # noqa: BLE001 - reported: which construct fails to lower is the finding
        return {"error": str(exc).strip().splitlines()[-1][:200]}
    ptx = kernel.asm["ptx"]
    return {"shared_bytes": kernel.metadata.shared, "wgmma": "wgmma" in ptx, "cp_async": "cp.async" in ptx,
            "loads": {op: ptx.count(op) for op in GLOBAL_LOADS}, "widening": {op: ptx.count(op) for op in WIDENING},
            "flushing_arithmetic": len(FLUSHING_ARITHMETIC.findall(ptx)),
            **_resources(kernel.asm["cubin"]),
            **({"key_loop": _innermost_loop(kernel.asm["cubin"])} if key_loop else {})}


def linear_report(n: int, k: int, activation, rows: int, weight: str = "bf16", target=TARGET,
                  smem: int = gemm.SM_SHARED_BYTES) -> tuple:
    """(tile, report) of the linear kernel over a bf16, FP8 ("fp8": bf16 rows) or W8A8 ("w8a8": FP8
    rows too) weight [n, k] at the tile of a `rows`-row launch on `target` (TMA and dependent launches
    from sm_90 on) with `smem` bytes of shared memory per program."""
    fp8, w8a8 = weight in ("fp8", "w8a8"), weight == "w8a8"
    hopper = target.arch >= 90
    if w8a8:
        cfg = gemm.linear_config(n, k, FP8_DTYPE, activation, rows, tma=hopper, smem=smem)
    else:
        cfg = gemm.linear_config(n, k, torch.bfloat16, activation, rows, FP8_DTYPE if fp8 else None, tma=hopper,
                                 smem=smem)
    x_type = "fp8e4nv" if w8a8 else "bf16"
    if cfg.tma:
        w_type = "fp8e4nv" if fp8 else "bf16"
        descs = {"x_desc": f"tensordesc<{x_type}[{cfg.block_m}, {cfg.block_k}]>",
                 "w_desc": f"tensordesc<{w_type}[{cfg.block_n}, {cfg.block_k}]>", "scale_ptr": "*fp32",
                 "x_scale_ptr": "*fp32", "out_ptr": "*bf16", "ws_ptr": "*fp32", "active_ptr": "*i32"}
        const = dict(HAS_ACTIVE=True, SWIGLU=activation == "swiglu", HAS_SCALE=fp8, X_FP8=w8a8, WIDEN_INLINE=True,
                     EXACT_DOT=False,
                     BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                     SPLIT_K=cfg.split_k, STAGES=cfg.num_stages, REDUCE_IN_TILE=cfg.reduce_in_tile, SWAP_AB=cfg.swap_ab,
                     PDL=hopper)
        return cfg, compile_sm90(gemm._linear_tma_kernel, descs, const, target=target, num_warps=cfg.num_warps,
                                 num_stages=cfg.num_stages)
    ptrs = {"x_ptr": f"*{x_type}", "w_ptr": "*fp8e4nv" if fp8 else "*bf16", "scale_ptr": "*fp32",
            "x_scale_ptr": "*fp32", "out_ptr": "*bf16", "ws_ptr": "*fp32", "active_ptr": "*i32"}
    const = dict(HAS_ACTIVE=True, SWIGLU=activation == "swiglu", HAS_SCALE=fp8, X_FP8=w8a8, WIDEN_INLINE=True,
                 EXACT_DOT=False,
                 PRECISION="tf32", EVEN_K=k % cfg.block_k == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                 BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SPLIT_K=cfg.split_k, SWAP_AB=cfg.swap_ab, PDL=hopper)
    return cfg, compile_sm90(gemm._linear_kernel, ptrs, const, target=target, num_warps=cfg.num_warps,
                             num_stages=cfg.num_stages)


SM89 = GPUTarget("cuda", 89, 32)
SM89_SHARED_BYTES = 99 * 1024  # shared memory a program may use on sm_89 (and sm_86, sm_120)
HUGINN_WEIGHTS = [("wqkv", 15840, 5280, None), ("proj", 5280, 5280, None), ("fc", 35840, 5280, "swiglu"),
                  ("mlp_proj", 5280, 17920, None)]


def small_smem_linear_reports(weights=("bf16", "w8a8"), rows=(1, 64, 256, 2048)) -> dict:
    """Ouro's and Huginn's layer weights on an sm_89 GPU (99 KiB per program): {name: shared bytes or
    the compiler's error} of each tile `linear_config` picks there."""
    out = {}
    for name, n, k, act in OURO_WEIGHTS[:4] + HUGINN_WEIGHTS:
        for weight in weights:
            for m in rows:
                cfg, rep = linear_report(n, k, act, m, weight, target=SM89, smem=SM89_SHARED_BYTES)
                out[f"{name} {weight} M={m} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.num_stages}"] = \
                    rep.get("shared_bytes", rep.get("error"))
    return out


def linear_reports() -> dict:
    """bf16 weights, FP8 weights (quantization="fp8": fp8 tiles widened to bf16, scales in the
    epilogue) and W8A8 (quantization="w8a8_fp8": FP8 rows and weights, FP8 products)."""
    out = {}
    for weight in ("bf16", "fp8", "w8a8"):
        for name, n, k, act in OURO_WEIGHTS:
            if weight != "bf16" and name == "lm_head":
                continue  # the LM head stays bf16
            for rows in (1, 64, 256, 2048):  # the skinny and full decode, middle and prefill row classes
                cfg, report = linear_report(n, k, act, rows, weight)
                out[f"linear {weight} {name} M={rows} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.num_stages} "
                    f"split {cfg.split_k}{' in tile' if cfg.reduce_in_tile else ''}{' transposed' if cfg.swap_ab else ''}"
                    f"{' TMA' if cfg.tma else ''}"] = report
        ptrs = {"ws_ptr": "*fp32", "scale_ptr": "*fp32", "x_scale_ptr": "*fp32", "out_ptr": "*bf16", "active_ptr": "*i32"}
        const = dict(HAS_ACTIVE=True, SWIGLU=True, HAS_SCALE=weight != "bf16", X_FP8=weight == "w8a8", SPLIT_K=2,
                     BLOCK_M=gemm.REDUCE_BLOCK_M,
                     BLOCK_N=gemm.REDUCE_BLOCK_N, PDL=True)
        out[f"linear {weight} split-K reduction"] = compile_sm90(gemm._split_reduce_kernel, ptrs, const, num_warps=4)
    return out


def _attention_signature(cache: str) -> tuple[dict, dict]:
    """Pointer types and flags of the attention kernels over a bf16 or FP8 ("fp8") cache, as the
    engine launches them for Ouro (block size 16, key-depth table, slots, tensor depths); the
    pointers include the decode kernel's RoPE inputs."""
    kv = "*fp8e4nv" if cache == "fp8" else "*bf16"
    ptrs = {"q_ptr": "*bf16", "out_ptr": "*bf16", "k_ptr": kv, "v_ptr": kv}
    ptrs.update({n: "*i32" for n in ("tables_ptr", "seq_lens_ptr", "qsl_ptr", "slots_ptr", "qdepth_ptr",
                                     "key_depth_ptr", "active_ptr", "decode_from_ptr")},
                ws_ptr="*fp32", k_scale_ptr="*fp32", v_scale_ptr="*fp32", counters_ptr="*i32",
                rope_k_ptr="*bf16", rope_v_ptr="*bf16", pos_ptr="*i64", cos_sin_ptr="*fp32", write_slot_ptr="*i64",
                q_bias_ptr="*bf16", k_bias_ptr="*bf16")
    flags = dict(BLOCK_SIZE=16, HAS_ACTIVE=True, HAS_SLOTS=True, QDEPTH_TENSOR=True, HAS_KEY_DEPTH=True,
                 DECODE_FROM_TENSOR=True, KV_FP8=cache == "fp8", PDL=True, KV_ALIGNED=True)
    return ptrs, flags


def decode_attention_report(cache: str, split: bool, rope: bool = False, warps: int | None = None,
                            tiles: int | None = None, key_loop: bool = False, key_depth: bool = True) -> dict:
    """The decode kernel at Ouro's shape (16 heads of 128, MHA) over a bf16 or FP8 cache, split (as
    at batch 1) or not (as at batch 256), with or without RoPE and the K/V write, with or without
    the key-depth table (without: the engine's fixed-depth steps); warps and key tiles in flight
    default to the launcher's."""
    ptrs, flags = _attention_signature(cache)
    flags["HAS_KEY_DEPTH"] = key_depth
    cfg = attention._decode_shape(16, 16, 128, kv_fp8=cache == "fp8")
    default_warps = cfg.pop("num_warps")
    tiles = attention.decode_tiles(cache == "fp8", small=split) if tiles is None else tiles
    const = dict(cfg, SPLIT=split, TILES=tiles, MERGE_IN_PLACE=split, WIDEN_INLINE=True, **flags, ROPE=rope,
                 GPTJ=False, HAS_Q_BIAS=False, HAS_K_BIAS=False, UNFUSED=rope, HEADS_FAST=True)
    return compile_sm90(attention._decode_attention_kernel, ptrs, const, floats=("qk_scale",),
                        num_warps=warps or default_warps, num_stages=attention.DECODE_STAGES, key_loop=key_loop)


def attention_reports() -> dict:
    """The tile kernel and the decode kernel, on bf16 and FP8 (kv_cache_dtype="fp8") caches."""
    out = {}
    for cache in ("bf16", "fp8"):
        ptrs, flags = _attention_signature(cache)
        for warps, few_queries in ((4, False), (4, True), (8, False)):
            cfg = attention._tile_shape(16, 16, 128, torch.bfloat16, few_queries)  # Ouro: 16 heads of 128, MHA
            cfg.pop("num_warps")
            stages = cfg.pop("num_stages")
            const = dict(cfg, BLOCK_N=attention.KEY_TILE, DOT_PRECISION="tf32", EXACT_DOT=False, WIDEN_INLINE=True,
                         **flags)
            out[f"paged_attention {cache} depth-aware, {warps} warps, {stages} stages"] = compile_sm90(
                attention._paged_attention_kernel, ptrs, const, floats=("qk_scale",), num_warps=warps,
                num_stages=stages)
        warps = attention._decode_shape(16, 16, 128, kv_fp8=cache == "fp8")["num_warps"]
        for split in (True, False):  # a split launch as at batch 1 (small), an unsplit one as at batch 256
            for rope in (False, True):
                name = (f"decode attention {cache} depth-aware, {warps} warps, {'split' if split else 'unsplit'}"
                        + (", RoPE + K/V write" if rope else ""))
                out[name] = decode_attention_report(cache, split, rope, key_loop=True)
    return out


def kv_reports() -> dict:
    """The K/V scatter kernels (plain and with RoPE) writing bf16 and FP8 caches (Ouro: 16 heads of 128)."""
    from rlt_kernels import kv_cache

    out = {}
    block_h, block_d = kv_cache.head_tile_shape(16, 128)
    for cache in ("bf16", "fp8"):
        cache_t = "*fp8e4nv" if cache == "fp8" else "*bf16"
        ptrs = {n: "*bf16" for n in ("q_ptr", "q_out_ptr", "k_ptr", "v_ptr", "cos_sin_ptr", "q_bias_ptr", "k_bias_ptr")}
        ptrs.update(k_cache_ptr=cache_t, v_cache_ptr=cache_t, slot_ptr="*i64", active_ptr="*i32", pos_ptr="*i64",
                    k_scale_ptr="*fp32", v_scale_ptr="*fp32")
        const = dict(HEAD_DIM=128, BLOCK_H=block_h, BLOCK_D=block_d, HAS_ACTIVE=True, FP8=cache == "fp8", PDL=True)
        out[f"kv_scatter {cache}"] = compile_sm90(kv_cache._kv_scatter_kernel, ptrs, const, num_warps=kv_cache.NUM_WARPS)
        const.update(GPTJ=False, HAS_Q_BIAS=False, HAS_K_BIAS=False, Q_FP64=False, K_FP64=False)
        out[f"rope_kv_scatter {cache}"] = compile_sm90(kv_cache._rope_kv_scatter_kernel, ptrs, const,
                                                        num_warps=kv_cache.NUM_WARPS, enable_fp_fusion=False)
    return out


def main() -> None:
    print(f"Triton {triton.__version__}, target sm_90")
    for name, rep in {**linear_reports(), **attention_reports(), **kv_reports()}.items():
        print(f"{name:45s} {rep}")


if __name__ == "__main__":
    main()
