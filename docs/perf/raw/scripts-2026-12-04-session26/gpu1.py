"""Session 26, call 1: skinny decode tiles fetched by TMA (transposed product) against the cp.async
tiles in use: per-weight sweep at M = 1 / 16 / 64 (bits checked), then the decode chain A/B."""
import dataclasses, functools, itertools, json, os, sys, time
import torch
from perf.conftest import cuda_time_ms
from perf import bench_decode_chain as bdc
from rlt_kernels import gemm

OUT = os.environ.get("OUT", "out")
DT = torch.bfloat16
WEIGHTS = {"qkv": (6144, 2048, None), "o": (2048, 2048, None), "gate_up": (11264, 2048, "swiglu"),
           "down": (2048, 5632, None)}
res = {"sweep": {}, "chain": []}


def weights(n, k):
    w = torch.randn(n, k, dtype=DT, device="cuda") * k**-0.5
    return [w] + [w.clone() for _ in range(max(1, min(24, (512 << 20) // w.nbytes)) - 1)]


def sweep():
    for name, (n, k, act) in WEIGHTS.items():
        ws = weights(n, k)
        acc = 2 if act else 1
        n_out = n // acc
        for m in (1, 16, 64):
            gemm.SKINNY_TMA = False
            gemm.linear_config.cache_clear()
            use = gemm.linear_config(n, k, DT, act, m)
            if not use.swap_ab:
                continue
            x = torch.randn(m, k, dtype=DT, device="cuda")
            out = torch.empty(m, n_out, dtype=DT, device="cuda")
            ref = gemm._launch(x, ws[0], torch.empty_like(out), None, act, use).clone()
            cands = [use]
            for bk, st in itertools.product(sorted({use.block_k, 64, 128, 256}), (3, 4, 5, 6, 8)):
                c = dataclasses.replace(use, block_k=bk, num_stages=st, tma=True)
                if c.k_bounds(k) != use.k_bounds(k):
                    continue
                if st * (use.block_m + acc * use.block_n) * bk * 2 > 220 * 1024:
                    continue
                cands.append(c)
            rows = []
            for c in cands:
                try:
                    got = gemm._launch(x, ws[0], torch.empty_like(out), None, act, c)
                    same = bool(torch.equal(got, ref))
                    run = itertools.cycle([functools.partial(gemm._launch, x, w, out, None, act, c) for w in ws])
                    us = cuda_time_ms(lambda: next(run)(), iters=40) * 1e3
                except Exception as e:  # noqa: BLE001
                    rows.append({"cfg": dataclasses.asdict(c), "error": str(e)[:200]})
                    print(name, m, c, "ERROR", str(e)[:200], flush=True)
                    continue
                rows.append({"cfg": dataclasses.asdict(c), "us": us, "same_bits": same, "in_use": c == use})
                print(f"{name:8s} M={m:3d} tma={c.tma} bk={c.block_k:3d} st={c.num_stages} {us:7.2f} us bits={same}",
                      flush=True)
            res["sweep"][f"{name}/M{m}"] = rows
        del ws
        torch.cuda.empty_cache()


def chain_ab(batches=(1, 4, 16, 64), rounds=2):
    floor = None
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
    gemm.SKINNY_TMA = False
    gemm.linear_config.cache_clear()


t0 = time.time()
parts = sys.argv[1:] or ["sweep", "chain"]
if "chain" in parts:
    chain_ab()
    json.dump(res, open(f"{OUT}/s26_gpu1.json", "w"), indent=1)
if "sweep" in parts:
    sweep()
res["seconds"] = time.time() - t0
json.dump(res, open(f"{OUT}/s26_gpu1.json", "w"), indent=1)
print("done", res["seconds"])
