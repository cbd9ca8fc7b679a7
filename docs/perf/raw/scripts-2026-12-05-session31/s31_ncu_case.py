"""Session 31: the FP8 (and bf16) decode attention call at 256 x 192 keys, called eagerly a few times
for Nsight Compute.  python3 s31_ncu_case.py fp8|bf16"""
import sys, torch
from perf import bench_decode_attention as B

c = B.engine_case(256, 192)
if sys.argv[1] == "fp8":
    c = B.fp8_case(c)
out = torch.empty_like(c["q"])
call = B.rlt_call(c, out, 0)
for _ in range(4):
    call()
torch.cuda.synchronize()
