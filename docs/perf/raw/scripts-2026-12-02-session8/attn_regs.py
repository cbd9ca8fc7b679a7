"""Decode attention: register caps (maxnreg) and key tiles in flight; bits against the default."""
import json, os, sys
import torch
from perf.bench_decode_attention import engine_case, kv_bytes, rlt_call
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention

out_dir = sys.argv[1]
roof = measure()
variants = [("default", {}), ("r96", {"RLT_DECODE_MAXNREG": "96"}), ("r80", {"RLT_DECODE_MAXNREG": "80"}),
            ("r72", {"RLT_DECODE_MAXNREG": "72"}), ("r64", {"RLT_DECODE_MAXNREG": "64"}), ("r56", {"RLT_DECODE_MAXNREG": "56"}),
            ("t2", {"RLT_DECODE_TILES": "2"}), ("t2 r96", {"RLT_DECODE_TILES": "2", "RLT_DECODE_MAXNREG": "96"}),
            ("t2 r80", {"RLT_DECODE_TILES": "2", "RLT_DECODE_MAXNREG": "80"})]
rows = []
for batch, keys in [(256, 192), (64, 192), (16, 192), (256, 1024), (64, 4096)]:
    c = engine_case(batch, keys)
    nb = kv_bytes(batch, keys)
    base = None
    for name, env in variants:
        for k in ("RLT_DECODE_MAXNREG", "RLT_DECODE_TILES"):
            os.environ.pop(k, None)
        os.environ.update(env)
        o = torch.empty_like(c["q"])
        fn = rlt_call(c, o, 0)
        try:
            fn(); torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(name, "failed", type(e).__name__, str(e)[:200], flush=True)
            continue
        ms = cuda_time_ms(fn)
        if base is None:
            base = o.clone()
        row = dict(batch=batch, keys=keys, variant=name, us=ms * 1e3, frac=nb / (ms * 1e-3) / 1e9 / roof["copy_gbps"],
                   same_bits=bool(torch.equal(o, base)))
        rows.append(row)
        print(json.dumps(row), flush=True)
    del c
for k in ("RLT_DECODE_MAXNREG", "RLT_DECODE_TILES"):
    os.environ.pop(k, None)
json.dump(dict(roofline=roof, rows=rows), open(os.path.join(out_dir, "attn_regs.json"), "w"), indent=1)
