"""The decode attention writing o's FP8 input rows itself (`paged_attention(..., fp8_out=...)`,
branch `fp8-attention-rows`) against the same launch followed by `quantize_rows` (the switches
`FP8_ROWS_IN_SPLIT_LAUNCHES` / `FP8_ROWS_IN_UNSPLIT_LAUNCHES` off), at the engine's decode shapes
(range counters as the engine passes them, no key-depth table as its fixed-depth steps): us per
call, two interleaved runs of each, and whether the rows, scales and output have the same bits.

    python3 scratch/s33_rows_ab.py OUT.json
"""
import json
import sys

import torch

from perf import bench_decode_attention as B
from perf.conftest import cuda_time_ms
from rlt_kernels import attention
from rlt_kernels.fp8_rows import empty_rows

SHAPES = [(1, 192), (4, 192), (8, 192), (16, 192), (64, 192), (128, 192), (256, 192), (256, 1024)]


def set_rows_in_kernel(on: bool) -> None:
    attention.FP8_ROWS_IN_SPLIT_LAUNCHES = attention.FP8_ROWS_IN_UNSPLIT_LAUNCHES = on


rows = []
for cache in ("fp8", "bf16"):
    for batch, keys in SHAPES:
        c = B.engine_case(batch, keys, key_depth=False)
        if cache == "fp8":
            c = B.fp8_case(c)
        counters = attention.new_range_counters("cuda")
        results = {}
        for mode in ("separate", "in kernel", "separate", "in kernel"):
            set_rows_in_kernel(mode == "in kernel")
            out = torch.empty_like(c["q"])
            q8, s8 = empty_rows(out.view(batch, -1))

            def call(out=out, q8=q8, s8=s8):
                attention.paged_attention(c["q"], c["k"], c["v"], c["tables"], c["seq_lens"], c["qsl"], out=out,
                                          workspace=c["workspace"], decode_from=0, range_counters=counters,
                                          fp8_out=q8, fp8_out_scale=s8, **c["kw"])
            us = cuda_time_ms(call) * 1e3
            got = (out.view(torch.int16).clone(), q8.view(torch.uint8).clone(), s8.clone())
            first = results.setdefault(mode, got)
            ref = results["separate"]
            row = dict(cache=cache, batch=batch, keys=keys, mode=mode, us=round(us, 2),
                       same_bits=all(torch.equal(a, b) for a, b in zip(got, ref)),
                       counters_zero=not bool(counters.any()))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del c
        torch.cuda.empty_cache()
set_rows_in_kernel(True)
json.dump({"rows": rows}, open(sys.argv[1], "w"), indent=1)
