"""The decode attention of `main`, of branch `fp8-decode-address-math` and of branch
`fp8-decode-pairs` (checked out), in one process: us per call (two interleaved runs of each), the
fraction of the copy bandwidth, and the bits against `main`'s. bf16 and FP8 caches at the engine's
shapes, with the key-depth table (as `perf.bench_decode_attention` calls it) and without it (as the
engine's fixed-depth steps, the FP8 speed runs, call it).

Expected bits: the address branch has `main`'s everywhere (so it did under the interpreter); the
pairs branch has them over bf16 caches, and over FP8 caches its fp32 sums differ from `main`'s in
the last places (tiles applied in pairs), which a bf16 output mostly rounds away.

    git show main:rlt_kernels/attention.py > scratch/attention_main.py
    git show fp8-decode-address-math:rlt_kernels/attention.py > scratch/attention_addr.py
    python3 docs/perf/raw/scripts-2026-12-05-session32/s32_decode_ab.py OUT.json   # on fp8-decode-pairs
"""
import importlib.util
import json
import sys

import torch

from perf import bench_decode_attention as B
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention as pairs


def load(name, path):
    spec = importlib.util.spec_from_file_location(f"rlt_kernels._attention_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CODES = {"main": load("main", "scratch/attention_main.py"), "addr": load("addr", "scratch/attention_addr.py"),
         "pairs": pairs}
SHAPES = [(1, 192), (16, 192), (64, 192), (128, 192), (256, 192), (256, 512), (64, 1024), (256, 1024), (64, 4096),
          (16, 32768)]

roof = measure()
print(json.dumps(roof), flush=True)
rows = []
for cache in ("fp8", "bf16"):
    for key_depth in (False, True):
        for batch, keys in SHAPES:
            c = B.engine_case(batch, keys, key_depth=key_depth)
            if cache == "fp8":
                c = B.fp8_case(c)
            bits = {}
            for code in ("main", "addr", "pairs", "main", "addr", "pairs"):
                mod = CODES[code]
                out = torch.empty_like(c["q"])

                def call(mod=mod, out=out):
                    mod.paged_attention(c["q"], c["k"], c["v"], c["tables"], c["seq_lens"], c["qsl"], out=out,
                                        workspace=c["workspace"], decode_from=0, **c["kw"])
                ms = cuda_time_ms(call)
                bits.setdefault(code, out.view(torch.int16).clone())
                nbytes = B.kv_bytes(batch, keys) // (2 if cache == "fp8" else 1)
                row = dict(cache=cache, key_depth=key_depth, batch=batch, keys=keys, code=code, us=round(ms * 1e3, 2),
                           frac=round(nbytes / (ms * 1e-3) / 1e9 / roof["copy_gbps"], 3),
                           same_bits_as_main=bool(torch.equal(out.view(torch.int16), bits["main"])))
                rows.append(row)
                print(json.dumps(row), flush=True)
            del c
            torch.cuda.empty_cache()
json.dump({"roofline": roof, "rows": rows}, open(sys.argv[1], "w"), indent=1)
