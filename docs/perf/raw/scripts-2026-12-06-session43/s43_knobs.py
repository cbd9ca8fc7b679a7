"""perf.bench_fp8 with some of the decode step's constants set first (session 43's prepared A/Bs).

    python3 scratch/s43_knobs.py [pdl_sms=N] [attention.NAME=VALUE ...] -- [perf.bench_fp8 arguments]

pdl_sms=N: a launch of up to N programs an SM is a dependent launch (main: 1; 0: every launch).
attention.NAME=VALUE: an integer constant of rlt_kernels.attention (e.g. FUSED_ROPE_BELOW_PROGRAMS_PER_SM,
DECODE_TILES_FP8).
"""
import runpy
import sys

from rlt_kernels import _pdl, attention

split = sys.argv.index("--")
for knob in sys.argv[1:split]:
    name, value = knob.split("=")
    if name == "pdl_sms":
        sms, one_wave = int(value), _pdl._pdl_programs
        _pdl._pdl_programs = lambda index, n=sms: (one_wave(index) * n if n else 1 << 30) if one_wave(index) else 0
    else:
        module, attr = name.split(".")
        assert module == "attention" and hasattr(attention, attr), name
        setattr(attention, attr, int(value))
    print("knob", name, value, flush=True)
sys.argv = ["perf.bench_fp8"] + sys.argv[split + 1:]
runpy.run_module("perf.bench_fp8", run_name="__main__")
