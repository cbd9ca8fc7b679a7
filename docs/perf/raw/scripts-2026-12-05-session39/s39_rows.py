"""Session 39: decode programs taking several (token, KV head) rows (attention.DECODE_ROWS), a row's
last lap loading the next row's first tiles. Kernel timings and bits against a row a program; then
the engines at batch 256.
    python3 scratch/s39_rows.py OUT.json kernels|engines
"""
import json
import sys
import time

import torch

from perf.bench_decode_attention import engine_case, fp8_case, kv_bytes, rlt_call
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention

CASES = [(256, 150), (256, 192), (128, 384), (64, 768), (256, 96), (128, 192), (64, 192), (512, 150),
         (256, 1024), (16, 192), (1, 192)]


def set_rows(rows, cap="rule", heads_fast=True):
    attention.DECODE_HEADS_FAST = heads_fast
    attention.DECODE_ROWS = rows
    attention.DECODE_ROWS_MIN_PROGRAMS_PER_SM = 0 if rows > 1 else 8
    if cap == "rule":
        attention.decode_register_cap = CAP_RULE
    else:
        attention.decode_register_cap = lambda *a, _c=cap: _c


CAP_RULE = attention.decode_register_cap


def regs():
    out = {}
    try:
        for dev_cache in attention._decode_attention_kernel.device_caches.values():
            for key, k in dev_cache[0].items():
                rows = "ROWS" in str(key)
                out[str(hash(key))[-6:]] = (k.n_regs, k.n_spills)
    except Exception as exc:  # noqa: BLE001
        out["error"] = str(exc)[:200]
    return out


def kernels(res, roof):
    variants = [("bf16", 1, "rule", False), ("bf16", 1, "rule", True), ("bf16", 2, "rule", True),
                ("fp8", 1, "rule", False), ("fp8", 1, "rule", True), ("fp8", 1, None, True), ("fp8", 2, 128, True),
                ("fp8", 2, 128, False)]
    for batch, keys in CASES:
        for kd in ((True, False) if (batch, keys) == (256, 150) else (True,)):
            c = engine_case(batch, keys, key_depth=kd)
            f8 = fp8_case(c)
            ref = {}
            row = {"batch": batch, "keys": keys, "key_depth": kd}
            for cache, rows, cap, hf in variants:
                if rows > 1 and batch * 16 // rows < 132 * 2:
                    continue
                case = c if cache == "bf16" else f8
                set_rows(rows, cap, hf)
                out = torch.empty_like(c["q"])
                name = f"{cache}_r{rows}_cap{cap}_hf{int(hf)}"
                try:
                    ms = cuda_time_ms(rlt_call(case, out, 0))
                except Exception as exc:  # noqa: BLE001
                    row[name] = str(exc)[:300]
                    continue
                bits = out.view(torch.int16).clone()
                ref.setdefault(cache, bits)
                nbytes = kv_bytes(batch, keys) // (2 if cache == "fp8" else 1)
                row[name] = [round(ms * 1e3, 2), round(nbytes / (ms * 1e-3) / 1e9 / roof["copy_gbps"], 3),
                             bool(torch.equal(bits, ref[cache]))]
            print(json.dumps(row), flush=True)
            res["kernels"].append(row)
            del c, f8
    set_rows(1)


def engines(res, roof):
    from perf.bench_engine import engine, free_engine
    from rlt_runtime.entrypoints.bench_offline import decode_benchmark

    variants = [("w8a8+kv hf0", True, False), ("w8a8+kv hf1", True, True)] * 2 + [
        ("bf16 hf0", None, False), ("bf16 hf1", None, True)]
    for name, kv, hf in variants:
        set_rows(1, heads_fast=hf)
        t0 = time.time()
        opts = {} if kv is None else {"quantization": "w8a8_fp8", "kv_cache_dtype": "fp8"}
        llm, info = engine("ouro-1.4b", max_num_seqs=256, cuda_graph_sizes=[256], **opts)
        decode_benchmark(llm, 4, 32, 8, prefix="warm")
        r = decode_benchmark(llm, 256, 128, 128, prefix="d256")
        row = {"variant": name, "ms_per_step": r["ms_per_step"], "device_ms_per_step": r.get("device_ms_per_step"),
               "build_s": info["init_s"], "total_s": time.time() - t0}
        print(json.dumps(row), flush=True)
        res["engines"].append(row)
        del llm
        free_engine()


def main():
    out, part = sys.argv[1], sys.argv[2]
    import triton
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "roof": measure(), "kernels": [], "engines": []}
    print(res["device"], res["roof"]["copy_gbps"], flush=True)
    try:
        (kernels if part == "kernels" else engines)(res, res["roof"])
    finally:
        json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
