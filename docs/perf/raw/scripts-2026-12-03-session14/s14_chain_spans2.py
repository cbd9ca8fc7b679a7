"""Decode chain with balanced column spans per weight (qkv / gate_up, gate_up stages), A/B/A/B, bits compared."""
import dataclasses, json, sys
import torch
from perf import bench_decode_chain as bdc
from perf.roofline import measure
from rlt_kernels import gemm

out_path = sys.argv[1]
original = gemm._skinny_config
VARIANTS = {"tiles": {}, "qkv spans": {6144: None}, "gate_up spans": {5632: None}, "gate_up spans s4": {5632: 4},
            "gate_up tiles s4": {5632: (0, 4)}, "both spans, gate_up s4": {6144: None, 5632: 4}}


def patched(table):
    def cfg(decode, n_out, *a, **kw):
        c = original(decode, n_out, *a, **kw)
        if n_out not in table:
            return c
        t = table[n_out]
        if isinstance(t, tuple):
            return dataclasses.replace(c, column_spans=t[0], num_stages=t[1])
        c = dataclasses.replace(c, column_spans=min(gemm.WAVE_CTAS, -(-n_out // gemm.SPAN_ROWS)))
        if c.block_m == gemm.SKINNY_ROWS and t is not None:
            c = dataclasses.replace(c, num_stages=t)
        return c
    return cfg


roof = measure()
floor = bdc.weight_bytes() / (roof["copy_gbps"] * 1e9) * 1e3
res = {"roofline": roof, "floor_ms": floor, "batches": {}}
variant = bdc.VARIANTS["dependent launches + in-place merge"]
for b in (1, 16, 64):
    chain = bdc.Chain(b)
    rows, ref = {}, None
    for rep in range(2):
        for name, table in VARIANTS.items():
            gemm._skinny_config = patched(table)
            gemm.linear_config.cache_clear()
            ms, out = bdc.time_variant(chain, variant, replays=30)
            ref = out if ref is None else ref
            rows.setdefault(name, []).append(ms)
            print(f"batch {b:3d} {name:24s} {ms:7.3f} ms {floor / ms:5.1%} bits {'same' if torch.equal(out, ref) else 'DIFFER'}", flush=True)
    res["batches"][b] = rows
    del chain
    torch.cuda.empty_cache()
gemm._skinny_config = original
json.dump(res, open(out_path, "w"), indent=1)
