"""`perf.bench_fp8` with FUSED_ROPE_BELOW_PROGRAMS_PER_SM_FP8 set first (branch `fp8-decode-pairs`):
2**31 fuses RoPE and the K/V write into every FP8 decode launch (the branch's default), 2 is
`main`'s rule (only launches below two (token, KV head) programs per SM).

    python3 scratch/s32_engines.py 2 --out $OUT/fp8-unfused --parts speed --configs "w8a8 + KV" --batches 64 256
"""
import sys

from perf import bench_fp8
from rlt_kernels import attention

attention.FUSED_ROPE_BELOW_PROGRAMS_PER_SM_FP8 = int(sys.argv[1])
bench_fp8.main(sys.argv[2:])
