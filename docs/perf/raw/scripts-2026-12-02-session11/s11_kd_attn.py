"""Decode attention at the engine's shapes (4 planes, 16 heads x 128, block 16), with the key-depth
table (steps with rows that may exit early, loops past 0) and without (loop 0, fixed-depth steps)."""
import json, sys
import torch
from perf.conftest import cuda_time_ms
from perf.test_bench_attention import engine_decode_case, kv_bytes, OURO
from rlt_kernels.attention import paged_attention, new_attention_workspace, new_range_counters
from perf.roofline import measure

roof = measure()
res = {"copy_gbps": roof["copy_gbps"]}
for b, ctx in ((1, 192), (16, 192), (64, 192), (256, 192), (256, 1024), (64, 4096)):
    q, k, v, t, sl, qsl, kw = engine_decode_case(b, ctx)
    ws = new_attention_workspace(q.shape[0], 16, 128, t.shape[2] * 16, device="cuda")
    rc = new_range_counters("cuda")
    out = torch.empty_like(q)
    r = {}
    for name, kd in (("key depths", kw["key_depth"]), ("no key depths", None)):
        fn = lambda: paged_attention(q, k, v, t, sl, qsl, out=out, workspace=ws, decode_from=0, range_counters=rc,
                                     query_depth=kw["query_depth"], key_depth=kd)
        ms = cuda_time_ms(fn)
        fn(); bits = out.clone()
        gbps = kv_bytes(b, ctx, 16, 128) / ms / 1e6
        r[name] = {"us": ms * 1e3, "gbps": gbps, "of_copy": gbps / roof["copy_gbps"]}
        r[name + " bits"] = bits
    r["same_bits"] = bool(torch.equal(r.pop("key depths bits"), r.pop("no key depths bits")))
    res[f"b{b}_ctx{ctx}"] = r
    print(b, ctx, r, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
