"""Offline sm_90 SASS of the unsplit decode kernel at Ouro's shape (16 x 128, MHA), with and without
the key-depth table, over FP8 and bf16 caches: registers and the key loop's instructions per
iteration (two FP8 tiles or one bf16 tile of 16 keys) and per K/V element a thread holds.

    PYTHONPATH=/path/to/triton-3.6:. python3 docs/perf/raw/scripts-2026-12-05-session32/s32_sass_counts.py
    (from the repository root, on the checkout to count)
"""
import json

from rlt_kernels import attention
from perf.sm90_resources import decode_attention_report

for cache in ("fp8", "bf16"):
    for key_depth in (False, True):
        tiles = attention.decode_tiles(cache == "fp8", small=False)
        r = decode_attention_report(cache, split=False, key_loop=True, key_depth=key_depth)
        elements = tiles * 16 * 128 * 2 // 128  # K and V elements a thread holds per iteration (4 warps)
        loop = r["key_loop"]["instructions"]
        print(json.dumps(dict(cache=cache, key_depth=key_depth, registers=r.get("registers"), stack=r.get("stack_bytes"),
                              loop_instructions=loop, per_element=round(loop / elements, 2))))
