"""Prefill attention: 64- vs 128-row query tiles (bits and time), beside SDPA flash / cuDNN."""
import json, os, sys
import torch
import torch.nn.functional as F
from perf.conftest import cuda_time_ms
from perf.test_bench_attention import OURO, paged_case, contiguous_kv, causal_flops
from rlt_kernels import attention
from rlt_kernels.attention import paged_attention

out_path = sys.argv[1]
tile_shape = attention._tile_shape
res = {}
cases = {}
for b, ctx, ql in ((1, 2048, 2048), (2, 2048, 2048), (8, 2048, 2048), (1, 4096, 2048), (16, 256, 256)):
    cases[f"b{b}_ctx{ctx}_q{ql}"] = (b, ctx, ql, paged_case(b, ctx, ql, **OURO))
variants = [(64, None, None, 64), (64, 4, 2, 64), (128, 8, 2, 64), (128, 8, 3, 64), (128, 4, 2, 64), (128, 8, 1, 64),
            (128, 8, 2, 128), (128, 8, 3, 128), (64, 4, 2, 128)]
ref = {}
for rows, warps, stages, key_tile in variants:
    def shaped(*a, _w=warps, _s=stages, **k):
        cfg = tile_shape(*a, **k)
        cfg["num_warps"] = _w or cfg["num_warps"]
        cfg["num_stages"] = _s or cfg["num_stages"]
        return cfg
    attention.MIN_TILE_ROWS = rows
    attention.KEY_TILE = key_tile
    attention._tile_shape = shaped
    label = f"rows{rows}_w{warps}_s{stages}_kt{key_tile}"
    for name, (b, ctx, ql, (q, k, v, t, sl, qsl)) in cases.items():
        out = torch.empty_like(q)
        fn = lambda: paged_attention(q, k, v, t, sl, qsl, out=out)
        try:
            ms = cuda_time_ms(fn)
        except Exception as exc:
            res[f"{name}_{label}"] = {"error": str(exc)[:300]}
            print(name, label, "error", str(exc)[:200], flush=True)
            continue
        fn()
        bits = out.view(torch.int16).clone()
        ref.setdefault(name, bits)
        fl = causal_flops(b, ctx, ql, 16, 128)
        res[f"{name}_{label}"] = {"ms": ms, "tflops": fl / ms / 1e9, "same_bits": bool(torch.equal(bits, ref[name]))}
        print(name, label, res[f"{name}_{label}"], flush=True)
attention.MIN_TILE_ROWS = 64
attention.KEY_TILE = 64
attention._tile_shape = tile_shape
from torch.nn.attention import sdpa_kernel, SDPBackend
for name, (b, ctx, ql, (q, k, v, t, sl, qsl)) in cases.items():
    qb = q.view(b, ql, 16, 128).transpose(1, 2).contiguous()
    kk, vv = contiguous_kv(k, v, t, 16)
    kk, vv = kk.contiguous(), vv.contiguous()
    fl = causal_flops(b, ctx, ql, 16, 128)
    for be in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
        try:
            with sdpa_kernel([getattr(SDPBackend, be)]):
                if ctx == ql:
                    f = lambda: F.scaled_dot_product_attention(qb, kk, vv, is_causal=True)
                else:  # queries are the last ql keys: bottom-right causal mask
                    from torch.nn.attention.bias import causal_lower_right
                    bias = causal_lower_right(ql, ctx)
                    f = lambda: F.scaled_dot_product_attention(qb, kk, vv, attn_mask=bias)
                ms = cuda_time_ms(f)
            res[f"{name}_sdpa_{be}"] = {"ms": ms, "tflops": fl / ms / 1e9}
        except Exception as exc:
            res[f"{name}_sdpa_{be}"] = {"error": str(exc)[:200]}
        print(name, be, res[f"{name}_sdpa_{be}"], flush=True)
json.dump(res, open(out_path, "w"), indent=1)
