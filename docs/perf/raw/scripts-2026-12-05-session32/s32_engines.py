"""`perf.bench_fp8` with two of the session's switches set first (branch `fp8-session32`, which has
both): FUSED_ROPE_BELOW_PROGRAMS_PER_SM_FP8 (2**31: RoPE and the K/V write fused into every FP8
decode launch, the branch's default; 2: `main`'s rule) and gemm.W8A8_MIDDLE_IN_TILE (1: W8A8
middle rows of Ouro down add their K ranges in the tile, the branch's default; 0: partials, as on
`main`).

    python3 scratch/s32_engines.py 2 0 --out $OUT/fp8-pairs-only --parts speed --configs "w8a8 + KV" --batches 256
"""
import sys

from perf import bench_fp8
from rlt_kernels import attention, gemm

attention.FUSED_ROPE_BELOW_PROGRAMS_PER_SM_FP8 = int(sys.argv[1])
gemm.W8A8_MIDDLE_IN_TILE = bool(int(sys.argv[2]))
gemm.linear_config.cache_clear()  # (configurations are cached)
bench_fp8.main(sys.argv[3:])
