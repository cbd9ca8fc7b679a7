"""Run a module with some of rlt_kernels' constants set first (session 44's prepared A/Bs; session 43's
s43_knobs.py for attention constants and PDL, generalised to gemm's).

    python3 scratch/s44_knobs.py [pdl_sms=N] [MODULE.NAME=VALUE ...] -- RUN_MODULE [its arguments]

pdl_sms=N: a launch of up to N programs an SM is a dependent launch (main: 1; 0: every launch).
MODULE.NAME=VALUE: an integer constant of rlt_kernels.attention or rlt_kernels.gemm (e.g.
gemm.WAVE_SPLIT_MIN_STEPS=2: W8A8's o splits K at decode, its only effect on Ouro's and Huginn's weights).
RUN_MODULE: perf.bench_fp8, or pytest (without -n: worker processes would not see the constants).
"""
import runpy
import sys

from rlt_kernels import _pdl, attention, gemm

MODULES = {"attention": attention, "gemm": gemm}
split = sys.argv.index("--")
for knob in sys.argv[1:split]:
    name, value = knob.split("=")
    if name == "pdl_sms":
        sms, one_wave = int(value), _pdl._pdl_programs
        _pdl._pdl_programs = lambda index, n=sms: (one_wave(index) * n if n else 1 << 30) if one_wave(index) else 0
    else:
        module, attr = name.split(".")
        assert module in MODULES and hasattr(MODULES[module], attr), name
        setattr(MODULES[module], attr, int(value))
    print("knob", name, value, flush=True)
gemm.linear_config.cache_clear()
run = sys.argv[split + 1]
sys.argv = [run] + sys.argv[split + 2:]
runpy.run_module(run, run_name="__main__")
