"""Session 26, call 2: the TMA skinny rule (gemm.SKINNY_TMA) against the cp.async tiles, per weight
(Ouro, Huginn, LM head; M = 1 / 4 / 16 / 64, bits checked) and in the decode chain A/B."""
import dataclasses, functools, itertools, json, os, sys, time
import torch
from perf.conftest import cuda_time_ms
from perf import bench_decode_chain as bdc
from rlt_kernels import gemm

OUT = os.environ.get("OUT", "out")
DT = torch.bfloat16
WEIGHTS = {"qkv": (6144, 2048, None), "o": (2048, 2048, None), "gate_up": (11264, 2048, "swiglu"),
           "down": (2048, 5632, None), "lm_head": (49152, 2048, None), "huginn.Wqkv": (15840, 5280, None),
           "huginn.proj": (5280, 5280, None), "huginn.fc": (35840, 5280, "swiglu"),
           "huginn.mlp_proj": (5280, 17920, None)}
res = {"sweep": {}, "chain": []}


def config(n, k, act, m, tma):
    gemm.SKINNY_TMA = tma
    gemm.linear_config.cache_clear()
    return gemm.linear_config(n, k, DT, act, m)


def sweep():
    for name, (n, k, act) in WEIGHTS.items():
        w = torch.randn(n, k, dtype=DT, device="cuda") * k**-0.5
        ws = [w] + [w.clone() for _ in range(max(1, min(24, (512 << 20) // w.nbytes)) - 1)]
        n_out = n // (2 if act else 1)
        for m in (1, 4, 16, 64):
            x = torch.randn(m, k, dtype=DT, device="cuda")
            out = torch.empty(m, n_out, dtype=DT, device="cuda")
            row = {}
            ref = None
            for tma in (False, True, False, True):
                c = config(n, k, act, m, tma)
                got = gemm._launch(x, ws[0], torch.empty_like(out), None, act, c).clone()
                ref = got if ref is None else ref
                run = itertools.cycle([functools.partial(gemm._launch, x, w_, out, None, act, c) for w_ in ws])
                us = cuda_time_ms(lambda: next(run)(), iters=40) * 1e3
                row.setdefault(f"tma={tma}", []).append(us)
                row[f"cfg tma={tma}"] = dataclasses.asdict(c)
                row["same_bits"] = row.get("same_bits", True) and bool(torch.equal(got, ref))
            res["sweep"][f"{name}/M{m}"] = row
            print(f"{name:16s} M={m:3d} cp.async {row['tma=False']} TMA {row['tma=True']} bits={row['same_bits']}",
                  flush=True)
        del ws, w
        torch.cuda.empty_cache()
    gemm.SKINNY_TMA = True
    gemm.linear_config.cache_clear()


def chain_ab(batches=(1, 4, 16, 64), rounds=3):
    for b in batches:
        chain = bdc.Chain(b)
        ref = None
        for r in range(rounds):
            for tma in (False, True):
                gemm.SKINNY_TMA = tma
                gemm.linear_config.cache_clear()
                ms, out = bdc.time_variant(chain, bdc.VARIANTS[bdc.ENGINE_VARIANT])
                ref = out if ref is None else ref
                row = {"batch": b, "round": r, "skinny_tma": tma, "ms": ms, "same_bits": bool(torch.equal(out, ref))}
                res["chain"].append(row)
                print("chain", row, flush=True)
        del chain
        torch.cuda.empty_cache()
    gemm.SKINNY_TMA = True
    gemm.linear_config.cache_clear()


t0 = time.time()
parts = sys.argv[1:] or ["chain", "sweep"]
if "chain" in parts:
    chain_ab()
    json.dump(res, open(f"{OUT}/s26_gpu2.json", "w"), indent=1)
if "sweep" in parts:
    sweep()
res["seconds"] = time.time() - t0
json.dump(res, open(f"{OUT}/s26_gpu2.json", "w"), indent=1)
print("done", res["seconds"])
