"""`perf.bench_fp8` with the switches of branch `fp8-attention-rows` set first (it holds
`fp8-session32` and the attention's FP8 rows):

- FUSED: attention.FUSED_ROPE_BELOW_PROGRAMS_PER_SM_FP8 (2**31: RoPE and the K/V write in every FP8
  decode launch, the branch's default; 2: `main`'s rule);
- IN_TILE: gemm.W8A8_MIDDLE_IN_TILE (1: W8A8 middle rows of Ouro down add their K ranges in the
  tile, the default; 0: partials, as on `main`);
- ROWS: attention.FP8_ROWS_IN_SPLIT_LAUNCHES and FP8_ROWS_IN_UNSPLIT_LAUNCHES as two digits
  (11: the decode attention writes o's FP8 rows in every launch, the default; 00: `quantize_rows`
  after it, as on `main`; 01: unsplit launches only).

    python3 scratch/s33_engines.py 2147483648 1 00 --out $OUT/fp8-no-rows --parts speed --configs "w8a8 + KV" w8a8
"""
import sys

from perf import bench_fp8
from rlt_kernels import attention, gemm

attention.FUSED_ROPE_BELOW_PROGRAMS_PER_SM_FP8 = int(sys.argv[1])
gemm.W8A8_MIDDLE_IN_TILE = bool(int(sys.argv[2]))
gemm.linear_config.cache_clear()  # (configurations are cached)
attention.FP8_ROWS_IN_SPLIT_LAUNCHES, attention.FP8_ROWS_IN_UNSPLIT_LAUNCHES = (c == "1" for c in sys.argv[3])
bench_fp8.main(sys.argv[4:])
