"""W8A8 Ouro down (2048 x 5632, split 4) into its residual norm (`linear_residual_norm`, as the
engine's decode steps call it) with `gemm.W8A8_MIDDLE_IN_TILE` on (branch `w8a8-down-in-tile`:
middle rows add the K ranges in the tile where that fills the waves) and off (`main`: four fp32
partials the norm adds): us per call at 128-512 rows, the tile taken, and whether the bits agree.

    python3 scratch/s32_down_in_tile.py OUT.json
"""
import json
import sys

import torch

from perf.conftest import cuda_time_ms
from rlt_kernels import gemm
from rlt_kernels.fp8 import FP8_DTYPE, quantize_weight_fp8
from rlt_kernels.fp8_rows import quantize_rows
from rlt_kernels.linear_norm import linear_residual_norm

gen = torch.Generator(device="cuda").manual_seed(0)
w8, ws = quantize_weight_fp8(torch.randn(2048, 5632, device="cuda", generator=gen).bfloat16() * 0.02)
post_w, next_w = (torch.randn(2048, device="cuda", generator=gen).bfloat16() + 1 for _ in range(2))
rows = []
for m in (128, 192, 256, 384, 512):
    xq, xs = quantize_rows(torch.randn(m, 5632, device="cuda", generator=gen).bfloat16())
    residual = torch.randn(m, 2048, device="cuda", generator=gen).bfloat16()
    outs = {}
    for in_tile in (False, True, False, True):
        gemm.W8A8_MIDDLE_IN_TILE = in_tile
        gemm.linear_config.cache_clear()  # (configurations are cached)
        cfg = gemm.linear_config(2048, 5632, FP8_DTYPE, None, m)
        call = lambda: linear_residual_norm(xq, w8, residual, post_w, next_w, 1e-6, weight_scale=ws, x_scale=xs)  # noqa: E731
        ms = cuda_time_ms(call)
        r, n = call()
        outs.setdefault(in_tile, (r.clone(), n.clone()))
        row = dict(m=m, in_tile_rule=in_tile, tile=[cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages],
                   reduce_in_tile=cfg.reduce_in_tile, us=round(ms * 1e3, 2),
                   same_bits=all(torch.equal(a, b) for a, b in zip(outs[in_tile], outs[False])))
        rows.append(row)
        print(json.dumps(row), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
