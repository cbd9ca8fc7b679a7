"""Session 42's prepared A/B: the decode attention with 2 warps a program against 4 (main), at engine shapes,
over FP8 caches (register caps 120, 128, none) and bf16 caches (no cap: 168 registers, no spill).

Offline (sm_90 SASS, Triton 3.6, session 42): with 2 warps the FP8 kernel's code outside the key loop
(prologue, lane fold, store) is issued by half the warps, about 1,700 warp instructions a row against
3,300, and its key loop 1,046 a 32-key lap against 1,116; at 150 keys about 22% fewer instructions a
row. It needs 162 registers uncapped (6 programs an SM), or 120 with no spill (8 programs).
Whether that is faster is what this measures. Variants change the lane fold's tree, so their bits
differ from main's; the error against the fp32 reference is reported for each.

    PYTHONPATH=/tmp/site:. python3 scratch/s42_decode_warps.py OUT.json
"""
import json
import sys

import torch

from perf.bench_decode_attention import engine_case, fp8_case, kv_bytes, rlt_call
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention

MAIN = (attention.DECODE_WARPS, attention.DECODE_FP8_MAX_REGISTERS, attention.decode_register_cap)
UNCAPPED = lambda *a: None  # noqa: E731
VARIANTS = {"main 4w cap96": (4, 96, MAIN[2]), "2w cap128": (2, 128, MAIN[2]), "2w cap120": (2, 120, MAIN[2]),
            "2w uncapped": (2, 96, UNCAPPED), "4w uncapped": (4, 96, UNCAPPED)}


def use(variant):
    attention.DECODE_WARPS, attention.DECODE_FP8_MAX_REGISTERS, attention.decode_register_cap = variant


def main():
    import triton
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "roof": measure(), "rows": []}
    print(res["device"], res["roof"]["copy_gbps"], flush=True)
    cases = [(256, 150), (256, 192), (128, 192), (64, 192), (16, 192), (1, 192), (256, 1024)]
    for (b, keys), cache in [(case, cache) for cache in ("fp8", "bf16") for case in cases]:
        c = engine_case(b, keys, key_depth=False)
        c = fp8_case(c) if cache == "fp8" else c
        ref = attention.paged_attention_reference(c["q"].float(), c["k"], c["v"], c["tables"], c["seq_lens"],
                                                  c["qsl"], **c["kw"])
        nbytes = kv_bytes(b, keys) // (2 if cache == "fp8" else 1)
        variants = VARIANTS if cache == "fp8" else {n: VARIANTS[n] for n in ("main 4w cap96", "2w uncapped")}
        outs, times = {}, {}
        for _ in range(2):
            for name, variant in variants.items():
                use(variant)
                out = torch.empty_like(c["q"])
                fn = rlt_call(c, out, 0)
                fn()
                torch.cuda.synchronize()
                outs[name] = out.clone()
                times.setdefault(name, []).append(cuda_time_ms(fn) * 1e3)
                use(MAIN)
        for name in variants:
            err = (outs[name].float() - ref).abs()
            row = {"cache": cache, "batch": b, "keys": keys, "variant": name, "us": times[name],
                   "frac_copy": nbytes / (min(times[name]) * 1e-6) / 1e9 / res["roof"]["copy_gbps"],
                   "same_bits_as_main": bool(torch.equal(outs[name], outs["main 4w cap96"])),
                   "max_err": float(err.max()), "mean_err": float(err.mean())}
            res["rows"].append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        del c
        torch.cuda.empty_cache()
    json.dump(res, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
