"""perf.bench_fp8 with three of the decode step's constants set first (session 42's prepared A/Bs): the
decode attention's warps a program, its FP8 register cap, and how many programs a launch may have
and still be a dependent launch, in SMs (main: 1).

    python3 scratch/s42_patched_bench.py WARPS CAP PDL_SMS [perf.bench_fp8 arguments]
    (CAP 0: uncapped; PDL_SMS 0: every launch dependent)
"""
import runpy
import sys

from rlt_kernels import _pdl, attention

warps, cap, pdl_sms = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
attention.DECODE_WARPS = warps
if cap:
    attention.DECODE_FP8_MAX_REGISTERS = cap
else:
    attention.decode_register_cap = lambda *a: None
one_wave = _pdl._pdl_programs
_pdl._pdl_programs = lambda index: (one_wave(index) * pdl_sms if pdl_sms else 1 << 30) if one_wave(index) else 0
sys.argv = ["perf.bench_fp8"] + sys.argv[4:]
runpy.run_module("perf.bench_fp8", run_name="__main__")
