"""Decode chain (perf.bench_decode_chain) with balanced column spans against the 64-row tiles, A/B/A/B, bits compared."""
import dataclasses, json, sys
import torch
from perf import bench_decode_chain as bdc
from perf.roofline import measure
from rlt_kernels import gemm

out_path = sys.argv[1]
fp8 = "--fp8" in sys.argv
original = gemm._skinny_config


def no_spans(*a, **kw):
    return dataclasses.replace(original(*a, **kw), column_spans=0)


def set_spans(on):
    gemm._skinny_config = original if on else no_spans
    gemm.linear_config.cache_clear()


roof = measure()
floor = bdc.weight_bytes(fp8) / (roof["copy_gbps"] * 1e9) * 1e3
res = {"roofline": roof, "floor_ms": floor, "fp8": fp8, "batches": {}}
variant = bdc.VARIANTS["dependent launches + in-place merge"]
for b in (1, 16, 64):
    chain = bdc.Chain(b, fp8=fp8)
    rows = {"spans": [], "tiles": []}
    outs = {}
    for rep in range(2):
        for on in (False, True):
            set_spans(on)
            ms, out = bdc.time_variant(chain, variant, replays=30)
            key = "spans" if on else "tiles"
            rows[key].append(ms)
            outs[key] = out
            print(f"batch {b:3d} fp8={fp8:d} {key:6s} {ms:7.3f} ms {floor / ms:5.1%} of floor", flush=True)
    rows["same_bits"] = bool(torch.equal(outs["spans"], outs["tiles"]))
    print(f"batch {b:3d} bits {'same' if rows['same_bits'] else 'DIFFER'}", flush=True)
    res["batches"][b] = rows
    del chain
    torch.cuda.empty_cache()
set_spans(True)
json.dump(res, open(out_path, "w"), indent=1)
