"""Session 38 A/B: W8A8 down at middle rows adding its K ranges in the tile (gemm.W8A8_MIDDLE_IN_TILE)
against fp32 partials added by the residual norm; then the engines at batch 256.

    python3 scratch/s38_ab.py OUT.json kernels|engines
"""
import json
import sys
import time

import torch

from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention, gemm, norms
from rlt_kernels.fp8 import FP8_DTYPE, quantize_weight_fp8
from rlt_kernels.fp8_rows import quantize_rows
from rlt_kernels.linear_norm import linear_residual_norm

N, K = 2048, 5632
COPIES = 24


def set_in_tile(on):
    gemm.W8A8_MIDDLE_IN_TILE = on
    gemm.linear_config.cache_clear()


def kernels(res):
    g = torch.Generator(device="cuda").manual_seed(0)
    ws = [quantize_weight_fp8(torch.randn(N, K, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02)
          for _ in range(COPIES)]
    wb = [torch.randn(N, K, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02 for _ in range(COPIES)]
    post, nxt = torch.rand(N, device="cuda", dtype=torch.bfloat16) + 0.5, torch.rand(N, device="cuda", dtype=torch.bfloat16) + 0.5
    for m in (128, 256, 384):
        x = torch.randn(m, K, device="cuda", generator=g, dtype=torch.bfloat16)
        xq, xs = quantize_rows(x)
        resid = torch.randn(m, N, device="cuda", generator=g, dtype=torch.bfloat16)
        q, qs = torch.empty(m, N, dtype=FP8_DTYPE, device="cuda"), torch.empty(m, device="cuda")
        it = [0]

        def w8a8():
            w, s = ws[it[0] % COPIES]
            it[0] += 1
            return linear_residual_norm(xq, w, resid, post, nxt, 1e-6, weight_scale=s, x_scale=xs, normed_out=q,
                                        normed_scale=qs)

        def bf16():
            w = wb[it[0] % COPIES]
            it[0] += 1
            return linear_residual_norm(x, w, resid, post, nxt, 1e-6)

        row = {"m": m}
        bits = {}
        for rnd in range(2):
            for name, on in (("partials", False), ("in_tile", True)):
                set_in_tile(on)
                row.setdefault(name + "_cfg", str(gemm.linear_config(N, K, FP8_DTYPE, None, m)))
                it[0] = 0
                r, _ = w8a8()
                torch.cuda.synchronize()
                bits[name] = (r.clone(), q.view(torch.uint8).clone(), qs.clone())
                row.setdefault(name + "_us", []).append(cuda_time_ms(w8a8, reps=COPIES) * 1e3)
        row["same_bits"] = all(torch.equal(a, b) for a, b in zip(bits["partials"], bits["in_tile"]))
        set_in_tile(True)
        if m == 256:  # bf16 down: its split tile (partials) against the same in-tile tile shape
            cfg = gemm.linear_config(N, K, torch.bfloat16, None, m)
            forced = gemm._tma_tile(N, K, m, 2, 2, 1, gemm.linear_config(N, K, torch.bfloat16), in_tile=True,
                                    must_fill=True)
            orig = gemm.linear_config
            for rnd in range(2):
                for name, c in (("bf16_partials", cfg), ("bf16_in_tile", forced)):
                    gemm.linear_config = lambda *a, _c=c, **kw: _c
                    it[0] = 0
                    row.setdefault(name + "_us", []).append(cuda_time_ms(bf16, reps=COPIES) * 1e3)
                    gemm.linear_config = orig
            row["bf16_cfgs"] = [str(cfg), str(forced)]
        print(json.dumps(row), flush=True)
        res["kernels"].append(row)


def engines(res):
    from perf.bench_engine import engine, free_engine
    from rlt_runtime.entrypoints.bench_offline import decode_benchmark
    fuse0 = attention.FUSED_ROPE_BELOW_PROGRAMS_PER_SM
    variants = [("w8a8+kv partials", True, False, False), ("w8a8+kv in_tile", True, True, False),
                ("w8a8+kv in_tile+rope", True, True, True)] * 2 + [("w8a8 partials", False, False, False),
                                                                   ("w8a8 in_tile", False, True, False),
                                                                   ("bf16", None, False, False)]
    for name, kv, on, rope in variants:
        set_in_tile(on)
        attention.FUSED_ROPE_BELOW_PROGRAMS_PER_SM = 10**9 if rope else fuse0
        t0 = time.time()
        opts = {} if kv is None else {"quantization": "w8a8_fp8"}
        if kv:
            opts["kv_cache_dtype"] = "fp8"
        llm, info = engine("ouro-1.4b", max_num_seqs=256, cuda_graph_sizes=[256], **opts)
        decode_benchmark(llm, 4, 32, 8, prefix="warm")
        r = decode_benchmark(llm, 256, 128, 128, prefix="d256")
        dev = r.get("device_ms_per_step")
        row = {"variant": name, "ms_per_step": r["ms_per_step"], "device_ms_per_step": dev, "build_s": info["init_s"],
               "total_s": time.time() - t0}
        print(json.dumps(row), flush=True)
        res["engines"].append(row)
        del llm
        free_engine()


def main():
    out, part = sys.argv[1], sys.argv[2]
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "roof": measure(), "kernels": [],
           "engines": []}
    import triton
    res["triton"] = triton.__version__
    print(res["device"], res["roof"]["copy_gbps"], flush=True)
    try:
        (kernels if part == "kernels" else engines)(res)
    finally:
        json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
