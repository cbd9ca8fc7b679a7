"""perf.bench_fp8 with the decode kernel's warps and FP8 register cap set first (session 42's prepared A/B).

    python3 scratch/s42_patched_bench.py WARPS CAP [perf.bench_fp8 arguments]   (CAP 0: uncapped)
"""
import runpy
import sys

from rlt_kernels import attention

warps, cap = int(sys.argv[1]), int(sys.argv[2])
attention.DECODE_WARPS = warps
if cap:
    attention.DECODE_FP8_MAX_REGISTERS = cap
else:
    attention.decode_register_cap = lambda *a: None
sys.argv = ["perf.bench_fp8"] + sys.argv[3:]
runpy.run_module("perf.bench_fp8", run_name="__main__")
