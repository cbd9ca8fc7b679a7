"""Skinny (transposed) decode GEMV tile sweep, bf16 and FP8 weights, with bit checks against linear_config's choice."""
import concurrent.futures, dataclasses, functools, itertools, json, multiprocessing, os, sys, time
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm, fp8

W = [("qkv", 6144, 2048, None), ("o", 2048, 2048, None), ("gate_up", 11264, 2048, "swiglu"), ("down", 2048, 5632, None),
     ("h.proj", 5280, 5280, None)]
ROWS = tuple(int(r) for r in os.environ.get("SWEEP_ROWS", "1,16").split(","))
BLOCK_M = int(os.environ.get("SWEEP_BLOCK_M", "16"))
ONLY = os.environ.get("SWEEP_ONLY")  # e.g. "qkv fp8,o fp8"
FP8_BKS = tuple(int(b) for b in os.environ.get("FP8_BKS", "256,512,1024").split(","))

def cands(n, k, act, dt):
    acc = 2 if act else 1
    elem = 1 if dt == "fp8" else 2
    split = gemm.linear_config(n, k, torch.bfloat16 if dt == "bf16" else fp8.FP8_DTYPE, act).split_k
    out = []
    bks = (128, 256, 512) if elem == 2 else FP8_BKS
    for bn, bk, st, wp in itertools.product((16, 32, 64, 128), bks, (2, 3, 4, 5, 6), (4, 8)):
        if wp == 8 and acc * bn < 128:
            continue
        if st * (BLOCK_M + acc * bn) * bk * elem > 200 * 1024:
            continue
        if BLOCK_M == 16 and st == 5:
            continue
        for sp in sorted({split} | ({4} if split == 1 and name_split_ok(n, k) and BLOCK_M == 16 else set())):
            out.append(gemm.LinearConfig(BLOCK_M, bn, bk, wp, st, split_k=sp, swap_ab=True))
            if BLOCK_M == 64 and bn <= 32:  # the untransposed decode tile (o at M <= 64)
                out.append(gemm.LinearConfig(BLOCK_M, bn, bk, wp, st, split_k=sp))
    return out

def name_split_ok(n, k):
    return k <= 2048 and n <= 2048  # informative: o-like weights with a different K plan

def make(n, k, dt, copies):
    w = torch.randn(n, k, device="cuda").mul(k ** -0.5).bfloat16()
    ws = [w] + [w.clone() for _ in range(copies - 1)]
    if dt == "fp8":
        q = [fp8.quantize_weight_fp8(x) for x in ws]
        return [a for a, _ in q], [s for _, s in q]
    return ws, [None] * len(ws)

def compile_one(n, k, act, dt, cfg):
    try:
        compile_inner(n, k, act, dt, cfg)
        return True
    except Exception:
        return False

def compile_inner(n, k, act, dt, cfg):
    ws, sc = make(n, k, dt, 1)
    n_out = n // 2 if act else n
    for m in ROWS:
        gemm._launch(torch.zeros(m, k, dtype=torch.bfloat16, device="cuda"), ws[0],
                     torch.empty(m, n_out, dtype=torch.bfloat16, device="cuda"), None, act, cfg, weight_scale=sc[0])
    torch.cuda.synchronize()

def main(outdir):
    res = {}
    for name, n, k, act in W:
        for dt in ("bf16", "fp8"):
            if ONLY and f"{name} {dt}" not in ONLY.split(","):
                continue
            t0 = time.time()
            cs = cands(n, k, act, dt)
            with concurrent.futures.ProcessPoolExecutor(14, mp_context=multiprocessing.get_context("spawn")) as pool:
                ok = list(pool.map(functools.partial(compile_one, n, k, act, dt), cs, chunksize=2))
            cs = [c for c, good in zip(cs, ok) if good]
            elem = 1 if dt == "fp8" else 2
            copies = max(2, min(32, (512 << 20) // (n * k * elem)))
            ws, sc = make(n, k, dt, copies)
            n_out = n // 2 if act else n
            chosen = {m: gemm.linear_config(n, k, ws[0].dtype, act, m) for m in ROWS}
            rows = []
            for cfg in cs + [chosen[ROWS[0]]]:
                row = {"cfg": dataclasses.asdict(cfg)}
                for m in ROWS:
                    x = torch.randn(m, k, device="cuda").bfloat16()
                    out = torch.empty(m, n_out, dtype=torch.bfloat16, device="cuda")
                    calls = [functools.partial(gemm._launch, x, w, out, None, act, cfg, weight_scale=s) for w, s in zip(ws, sc)]
                    it = itertools.cycle(calls)
                    row[f"us_M{m}"] = cuda_time_ms(lambda: next(it)(), iters=40) * 1e3
                    ref = gemm._launch(x, ws[0], torch.empty_like(out), None, act, chosen[m], weight_scale=sc[0])
                    got = gemm._launch(x, ws[0], torch.empty_like(out), None, act, cfg, weight_scale=sc[0])
                    row[f"bits_M{m}"] = bool(torch.equal(ref.view(torch.int16), got.view(torch.int16)))
                rows.append(row)
            ch = rows[-1]
            key = f"{name} {dt}"
            res[key] = rows
            print(f"== {key}: {len(cs)} candidates ({time.time()-t0:.0f} s); chosen {chosen[ROWS[0]]} "
                  + " ".join(f"M{m}={ch[f'us_M{m}']:.2f}us" for m in ROWS), flush=True)
            for m in ROWS:
                gb = n * k * elem / 1e3
                for r in sorted(rows, key=lambda r: r[f"us_M{m}"])[:5]:
                    c = r["cfg"]
                    print(f"  M{m:<3d} bn{c['block_n']:<4d}bk{c['block_k']:<5d}s{c['num_stages']} w{c['num_warps']} sp{c['split_k']} "
                          f"{r[f'us_M{m}']:7.2f} us {gb / r[f'us_M{m}']:6.0f} GB/s bits {r[f'bits_M{m}']}", flush=True)
            json.dump(res, open(os.path.join(outdir, "skinny_sweep.json"), "w"), indent=0)
            del ws
            torch.cuda.empty_cache()

if __name__ == "__main__":
    main(sys.argv[1])
