"""Session 26, call 4: skinny TMA tiles whose first weight step is loaded before the dependent-launch
wait (gemm.WARM_FIRST_STEP), 16-row TMA tiles (gemm.SKINNY_NARROW_TMA): decode chain A/B/C and per weight."""
import dataclasses, functools, itertools, json, os, sys, time
import torch
from perf.conftest import cuda_time_ms
from perf import bench_decode_chain as bdc
from rlt_kernels import gemm

OUT = os.environ.get("OUT", "out")
DT = torch.bfloat16
VARIANTS = {"cp.async16 (now)": (False, False), "tma16": (True, False), "tma16+warm": (True, True),
            "cp.async16, tma64+warm": (False, True)}
WEIGHTS = {"qkv": (6144, 2048, None), "o": (2048, 2048, None), "gate_up": (11264, 2048, "swiglu"),
           "down": (2048, 5632, None), "lm_head": (49152, 2048, None)}
res = {"sweep": {}, "chain": []}


def setv(name):
    gemm.SKINNY_NARROW_TMA, gemm.WARM_FIRST_STEP = VARIANTS[name]
    gemm.linear_config.cache_clear()


def chain_ab(batches=(1, 4, 16, 64), rounds=2):
    for b in batches:
        chain = bdc.Chain(b)
        ref = None
        for r in range(rounds):
            for name in VARIANTS:
                if b == 64 and name in ("tma16",):
                    continue
                setv(name)
                ms, out = bdc.time_variant(chain, bdc.VARIANTS[bdc.ENGINE_VARIANT])
                ref = out if ref is None else ref
                row = {"batch": b, "round": r, "variant": name, "ms": ms, "same_bits": bool(torch.equal(out, ref))}
                res["chain"].append(row)
                print("chain", row, flush=True)
        del chain
        torch.cuda.empty_cache()


def sweep():
    for wname, (n, k, act) in WEIGHTS.items():
        w = torch.randn(n, k, dtype=DT, device="cuda") * k**-0.5
        ws = [w] + [w.clone() for _ in range(max(1, min(24, (512 << 20) // w.nbytes)) - 1)]
        n_out = n // (2 if act else 1)
        for m in (1, 16, 64):
            x = torch.randn(m, k, dtype=DT, device="cuda")
            out = torch.empty(m, n_out, dtype=DT, device="cuda")
            row, ref = {}, None
            for name in VARIANTS:
                setv(name)
                c = gemm.linear_config(n, k, DT, act, m)
                got = gemm._launch(x, ws[0], torch.empty_like(out), None, act, c).clone()
                ref = got if ref is None else ref
                run = itertools.cycle([functools.partial(gemm._launch, x, w_, out, None, act, c) for w_ in ws])
                row[name] = cuda_time_ms(lambda: next(run)(), iters=40) * 1e3
                row["same_bits"] = row.get("same_bits", True) and bool(torch.equal(got, ref))
            res["sweep"][f"{wname}/M{m}"] = row
            print(wname, m, {k_: (round(v, 2) if isinstance(v, float) else v) for k_, v in row.items()}, flush=True)
        del ws, w
        torch.cuda.empty_cache()


t0 = time.time()
chain_ab()
json.dump(res, open(f"{OUT}/s26_gpu4.json", "w"), indent=1)
sweep()
setv("cp.async16 (now)")
res["seconds"] = time.time() - t0
json.dump(res, open(f"{OUT}/s26_gpu4.json", "w"), indent=1)
print("done", res["seconds"])
