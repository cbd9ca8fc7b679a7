"""Static sm_90 SASS of the unsplit decode kernel (Ouro 16 x 128, key-depth table), compiled offline:
registers and the key loop's instructions, per K/V element a thread holds in one iteration.

    PYTHONPATH=. python3 docs/perf/raw/scripts-2026-12-05-session31/s31_sass_loop.py fp8:4:2 bf16:4:1
    (cache:warps:key tiles in flight; from the repository root)
"""
import json
import sys

from perf.sm90_resources import decode_attention_report

for spec in sys.argv[1:]:
    cache, warps, tiles = spec.split(":")
    r = decode_attention_report(cache, split=False, warps=int(warps), tiles=int(tiles), key_loop=True)
    elements = int(tiles) * 16 * 128 * 2 // (32 * int(warps))  # K and V elements a thread holds per iteration
    loop = r["key_loop"]
    print(json.dumps(dict(cache=cache, warps=int(warps), tiles=int(tiles), registers=r.get("registers"),
                          stack=r.get("stack_bytes"), loop_instructions=loop["instructions"],
                          elements_per_thread=elements, per_element=round(loop["instructions"] / elements, 2),
                          top=loop["ops"])))
