"""Offline (sm_90): the FP8 and bf16 decode kernels at Ouro's shape (unsplit, no key depths) with 4
and 2 warps a program: registers, spill, key-loop and whole-kernel instructions a warp, and what a row
issues outside the loop (warps x the difference).

    PYTHONPATH=/tmp/t36:. python scratch/s42_decode_warps_sass.py   (Triton 3.6 at /tmp/t36)
"""
from perf import sm90_resources as R

for cache in ("fp8", "bf16"):
    for warps, caps in ((4, (96,)), (2, (96, 104, 128, None))):
        for cap in caps:
            r = R.decode_attention_report(cache, split=False, warps=warps, key_loop=True, key_depth=False,
                                          max_registers=cap)
            loop = r["key_loop"]
            print(cache, f"{warps} warps, cap {cap}: {r['registers']} registers, {r['stack_bytes']} bytes spilled, "
                  f"key loop {loop['instructions']}, kernel {loop['kernel_instructions']}, outside the loop a row "
                  f"{warps * (loop['kernel_instructions'] - loop['instructions'])}", flush=True)
