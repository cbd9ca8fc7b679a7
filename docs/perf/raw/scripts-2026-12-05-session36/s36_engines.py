"""perf.bench_fp8 with the decode kernel's register cap and the fused-RoPE rule switched:
    python3 scratch/s36_engines.py CAP FUSE_ALL [perf.bench_fp8 arguments]
CAP: maxnreg for the decode attention kernel (0: none); FUSE_ALL: 1 fuses RoPE + K/V write into
every decode launch, 0 keeps the rule."""
import sys

from rlt_kernels import attention

cap, fuse = int(sys.argv[1]), sys.argv[2] == "1"
ORIG = attention._decode_attention_kernel


class Capped:
    def __getitem__(self, grid):
        launch = ORIG[grid]
        return lambda *a, **kw: launch(*a, maxnreg=cap, **kw)


if cap:
    attention._decode_attention_kernel = Capped()
if fuse:
    attention.FUSED_ROPE_BELOW_PROGRAMS_PER_SM = 10**9
print("cap", cap, "fuse", fuse, flush=True)
from perf import bench_fp8  # noqa: E402

bench_fp8.main(sys.argv[3:])
