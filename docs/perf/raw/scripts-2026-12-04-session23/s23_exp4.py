"""Session 23, call 4: prefill tiles of the unsplit bf16 weights (Ouro qkv, gate_up + SwiGLU), bits vs the tile in use."""
import itertools, json, sys
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm

res = {}
for name, n, k, act in (("qkv", 6144, 2048, None), ("gate_up", 11264, 2048, "swiglu")):
    acc = 2 if act else 1
    n_out = n // acc
    plan = gemm.linear_config(n, k, torch.bfloat16, act)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(4)]
    for m in (1024, 2048, 4096):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n_out, device="cuda", dtype=torch.bfloat16)
        in_use = gemm.linear_config(n, k, torch.bfloat16, act, m)
        call = lambda cfg, i, o=None: gemm._launch(x, ws[i % 4], out if o is None else o, None, act, cfg)
        ref = call(in_use, 0, torch.empty_like(out)).view(torch.int16)
        it = itertools.count()
        rows = {"in_use": str(in_use)}
        for (bm, bn), bk, st, w in itertools.product(((128, 128), (64, 256), (128, 256), (128, 64), (64, 128)), (64, 128), (2, 3, 4, 5), (4, 8)):
            if st * (bm + acc * bn) * bk * 2 > 225 * 1024:
                continue
            if bm * acc * bn // (w * 32) > 128 or (bm == 128 and w == 4 and acc * bn > 64):
                continue
            cfg = gemm.LinearConfig(bm, bn, bk, w, st, split_k=1, tma=True)
            if cfg.k_bounds(k) != plan.k_bounds(k):
                continue
            label = f"{bm}x{bn}x{bk} w{w} s{st}"
            try:
                t = cuda_time_ms(lambda c=cfg: call(c, next(it)), iters=20) * 1e3
                rows[label] = {"us": round(t, 2), "same_bits": bool(torch.equal(call(cfg, 0, torch.empty_like(out)).view(torch.int16), ref))}
            except Exception as exc:
                rows[label] = {"error": str(exc)[:100]}
        good = sorted(((l, r) for l, r in rows.items() if isinstance(r, dict) and "us" in r), key=lambda kv: kv[1]["us"])
        cur = rows.get(f"{in_use.block_m}x{in_use.block_n}x{in_use.block_k} w{in_use.num_warps} s{in_use.num_stages}")
        rows["cublas"] = round(cuda_time_ms(lambda: torch.matmul(x, ws[next(it) % 4].T)) * 1e3, 2)
        print(name, m, "in use", cur, "cublas", rows["cublas"], good[:5], "all same bits", all(r["same_bits"] for _, r in good), flush=True)
        res[f"{name} M={m}"] = rows
        json.dump(res, open(sys.argv[1], "w"), indent=1)
