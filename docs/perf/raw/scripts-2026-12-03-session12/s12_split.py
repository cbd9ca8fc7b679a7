"""Session 12, call 1: wave splits for narrow weights (o 2048 x 2048 split 4 at decode).
GEMV from HBM (rotating copies), the decode chain, old vs new rule, plus qkv / gate_up split-2 variants."""
import json, sys, functools
import torch
from rlt_kernels import gemm
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from perf import bench_decode_chain as bdc

OUT = sys.argv[1]
roof = measure()
res = {"roofline": roof}
orig_config = gemm.linear_config
orig_min = gemm.WAVE_SPLIT_MIN_STEPS


def set_rule(name):
    gemm.linear_config = orig_config
    gemm.WAVE_SPLIT_MIN_STEPS = orig_min if name != "old" else 10**9
    orig_config.cache_clear()
    extra = {"qkv2": {(6144, 2048, None)}, "gu2": {(11264, 2048, "swiglu")},
             "qkv2+gu2": {(6144, 2048, None), (11264, 2048, "swiglu")}}.get(name.split(":")[-1], set())
    if extra:
        @functools.lru_cache(maxsize=None)
        def patched(n, k, dtype, activation=None, rows=None, weight_dtype=None, tma=True):
            cfg = orig_config(n, k, dtype, activation, rows, weight_dtype, tma)
            if (n, k, activation) in extra and cfg.swap_ab:
                import dataclasses
                return dataclasses.replace(cfg, split_k=2, num_stages=min(cfg.num_stages, 3))
            return cfg
        gemm.linear_config = patched


# 1. GEMVs from HBM
shapes = {"qkv": (6144, 2048, None), "o": (2048, 2048, None), "gate_up": (11264, 2048, "swiglu"), "down": (2048, 5632, None)}
g = torch.Generator(device="cuda").manual_seed(0)
gemv = {}
for name, (n, k, act) in shapes.items():
    copies = max(4, int(400e6 // (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16) * k**-0.5 for _ in range(copies)]
    for rows in (1, 16, 64, 256, 2048):
        x = torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16)
        r = {}
        for rule in ("old", "new"):
            set_rule(rule)
            cfg = gemm.linear_config(n, k, torch.bfloat16, act, rows)
            outs = []
            fn = lambda: [gemm.linear(x, w, activation=act) for w in ws]
            ms = cuda_time_ms(fn, reps=2)
            out = gemm.linear(x, ws[0], activation=act)
            ref = (x.float() @ ws[0].float().T)
            if act:
                f = n // 2
                ref = torch.nn.functional.silu(ref[:, :f]) * ref[:, f:]
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            us = ms * 1e3 / copies
            r[rule] = {"us": us, "gbps": n * k * 2 / us / 1e3, "cfg": str(cfg), "rel_err": err}
        gemv[f"{name}_M{rows}"] = r
        print(name, rows, {k2: (round(v['us'], 2), round(v['gbps']), v['rel_err']) for k2, v in r.items()}, flush=True)
    del ws
    torch.cuda.empty_cache()
res["gemv"] = gemv

# 2. the decode chain (engine launch: dependent launches + in-place merge)
chain_res = {}
for b in (1, 16, 64):
    chain = bdc.Chain(b)
    row = {}
    for rule in ("old", "new", "new:qkv2", "new:gu2", "new:qkv2+gu2"):
        set_rule(rule)
        ms, out = bdc.time_variant(chain, bdc.VARIANTS["dependent launches + in-place merge"])
        ms2, _ = bdc.time_variant(chain, bdc.VARIANTS["dependent launches + in-place merge"])
        floor = bdc.weight_bytes() / (roof["copy_gbps"] * 1e9) * 1e3
        row[rule] = {"ms": min(ms, ms2), "of_floor": floor / min(ms, ms2)}
        print("chain", b, rule, row[rule], flush=True)
    chain_res[b] = row
    del chain
    torch.cuda.empty_cache()
set_rule("new")
res["chain"] = chain_res
json.dump(res, open(OUT, "w"), indent=1)
