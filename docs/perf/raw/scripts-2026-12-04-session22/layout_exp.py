"""Decode attention over a head-major K/V cache ([blocks, KVH, block, D] in memory, passed as a
[blocks, block, KVH, D] view) against today's position-major cache: same bits? faster?"""
import json, sys
import torch
from perf.bench_decode_attention import engine_case, fp8_case, rlt_call, kv_bytes
from perf.conftest import cuda_time_ms
from perf.roofline import measure

def head_major(t):
    return t.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)

roof = measure()
rows = []
for batch, keys in [(1, 192), (16, 192), (64, 192), (256, 192), (64, 1024), (256, 1024), (64, 4096)]:
    c = engine_case(batch, keys)
    h = dict(c, k=head_major(c["k"]), v=head_major(c["v"]))
    assert h["k"].stride() != c["k"].stride()
    nb = kv_bytes(batch, keys)
    row = {"batch": batch, "keys": keys}
    for name, case in (("pos", c), ("head", h), ("pos_fp8", fp8_case(c)), ("head_fp8", fp8_case(h))):
        outd, outt = torch.empty_like(c["q"]), torch.empty_like(c["q"])
        ms = cuda_time_ms(rlt_call(case, outd, 0))
        mt = cuda_time_ms(rlt_call(case, outt, None))
        frac = nb / (ms * 1e-3) / 1e9 / roof["copy_gbps"] / (2 if "fp8" in name else 1)
        row[name] = {"decode_us": round(ms * 1e3, 2), "frac": round(frac, 3), "tile_us": round(mt * 1e3, 2),
                     "stride": list(case["k"].stride())}
        row[name + "_out"] = (outd.clone(), outt.clone())
    for a, b in (("pos", "head"), ("pos_fp8", "head_fp8")):
        row[f"{a}=={b}"] = [torch.equal(row[a + "_out"][i], row[b + "_out"][i]) for i in range(2)]
    for n in ("pos", "head", "pos_fp8", "head_fp8"):
        del row[n + "_out"]
    print(json.dumps(row), flush=True)
    rows.append(row)
    del c, h
    torch.cuda.empty_cache()
json.dump({"copy_gbps": roof["copy_gbps"], "rows": rows}, open(sys.argv[1], "w"), indent=1)
