"""Decode attention: session-12 kernel (24f62ed) against today's, engine-shaped calls, with and without key-depth reads, 4K and 64K tables."""
import json, sys
import torch
sys.path.insert(0, "scratch")
import attention_s12 as old
from perf.bench_decode_attention import engine_case, kv_bytes
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention as new

roof = measure()
rows = []
for limit in (4096, 65536):
    for batch, keys in ((1, 192), (16, 192), (64, 192), (256, 192), (256, 1024), (64, 4096)):
        c = engine_case(batch, keys, context_limit=limit)
        for key_depth in (True, False):
            kw = dict(c["kw"]) if key_depth else {}
            res = {}
            for name, mod in (("s12", old), ("now", new), ("s12b", old), ("nowb", new)):
                out = torch.empty_like(c["q"])
                f = lambda: mod.paged_attention(c["q"], c["k"], c["v"], c["tables"], c["seq_lens"], c["qsl"], out=out,
                                                workspace=c["workspace"], decode_from=0, **kw)
                ms = cuda_time_ms(f)
                res[name] = (ms * 1e3, out.clone())
            same = torch.equal(res["s12"][1], res["now"][1])
            row = dict(limit=limit, batch=batch, keys=keys, key_depth=key_depth, s12_us=min(res["s12"][0], res["s12b"][0]),
                       now_us=min(res["now"][0], res["nowb"][0]), same_bits=bool(same))
            row["now_frac"] = kv_bytes(batch, keys) / (row["now_us"] * 1e-6) / 1e9 / roof["copy_gbps"]
            rows.append(row)
            print(f"limit {limit:6d} b{batch:4d} x {keys:5d} kd={key_depth:d}  s12 {row['s12_us']:7.1f}  now {row['now_us']:7.1f} us "
                  f"({row['now_frac']:.0%})  bits {'same' if same else 'DIFFER'}", flush=True)
        del c
        torch.cuda.empty_cache()
json.dump({"roofline": roof, "rows": rows}, open(sys.argv[1], "w"), indent=1)
