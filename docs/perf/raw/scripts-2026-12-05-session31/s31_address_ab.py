"""Branch `fp8-decode-address-math`: the decode attention's address arithmetic (unsigned block and
slot divisions, 32-bit slot offsets, one 32 x 32-bit block product, word strides for FP8 caches)
against `main`'s, bf16 and FP8 caches at the engine's shapes: us per call (two interleaved runs of
each) and whether the outputs have main's bits (they must: the same addresses, the same arithmetic).

    git show main:rlt_kernels/attention.py > scratch/attention_main.py
    python3 s31_address_ab.py OUT.json
"""
import importlib.util, json, sys, torch
import rlt_kernels
from perf.conftest import cuda_time_ms
from perf import bench_decode_attention as B
from perf.roofline import measure
from rlt_kernels import attention as branch

spec = importlib.util.spec_from_file_location("rlt_kernels._attention_main", "scratch/attention_main.py")
main = importlib.util.module_from_spec(spec)
spec.loader.exec_module(main)

roof = measure()
print(json.dumps(roof), flush=True)
SHAPES = [(1, 192), (16, 192), (64, 192), (128, 192), (256, 192), (256, 512), (64, 1024), (256, 1024), (64, 4096), (16, 32768)]
rows = []
for cache in ("bf16", "fp8"):
    for batch, keys in SHAPES:
        c = B.engine_case(batch, keys)
        if cache == "fp8":
            c = B.fp8_case(c)
        bits = {}
        for name, mod in (("main", main, ), ("branch", branch), ("main", main), ("branch", branch)):
            out = torch.empty_like(c["q"])
            call = lambda: mod.paged_attention(c["q"], c["k"], c["v"], c["tables"], c["seq_lens"], c["qsl"], out=out,  # noqa: E731
                                               workspace=c["workspace"], decode_from=0, **c["kw"])
            ms = cuda_time_ms(call)
            bits.setdefault(name, out.view(torch.int16).clone())
            nbytes = B.kv_bytes(batch, keys) // (2 if cache == "fp8" else 1)
            row = dict(cache=cache, batch=batch, keys=keys, code=name, us=round(ms * 1e3, 2),
                       frac=round(nbytes / (ms * 1e-3) / 1e9 / roof["copy_gbps"], 3),
                       same_bits=bool(torch.equal(out.view(torch.int16), bits["main"])))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del c
        torch.cuda.empty_cache()
json.dump({"roofline": roof, "rows": rows}, open(sys.argv[1], "w"), indent=1)
