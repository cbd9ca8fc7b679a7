"""FP8 decode attention: 1 warp a program (register caps 168, 192, none) against main's 2 warps capped at 128.
Offline (sm_90, Triton 3.6): 1 warp uncapped 254 registers, no spill, a row's instructions at 150 keys about
17% fewer (key loop 978 a lap against 2 x 523; outside the loop 878 against 1,706).
    PYTHONPATH=/tmp/site:. python3 scratch/s46_decode_1warp.py OUT.json
"""
import json
import sys

import torch

from perf.bench_decode_attention import engine_case, fp8_case, kv_bytes, rlt_call
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention

MAIN = (attention.DECODE_WARPS_FP8, attention.DECODE_FP8_MAX_REGISTERS, attention.DECODE_FP8_CAP_FROM_PROGRAMS_PER_SM)
VARIANTS = {"main 2w cap128": MAIN, "1w uncapped": (1, 255, 10**9), "1w cap192": (1, 192, 0), "1w cap168": (1, 168, 0)}


def use(v):
    attention.DECODE_WARPS_FP8, attention.DECODE_FP8_MAX_REGISTERS, attention.DECODE_FP8_CAP_FROM_PROGRAMS_PER_SM = v


def main():
    import triton
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "roof": measure(), "rows": []}
    print(res["device"], res["roof"]["copy_gbps"], flush=True)
    for b, keys in [(256, 150), (256, 192), (128, 192), (64, 192), (16, 192), (1, 192), (256, 1024)]:
        c = fp8_case(engine_case(b, keys, key_depth=False))
        ref = attention.paged_attention_reference(c["q"].float(), c["k"], c["v"], c["tables"], c["seq_lens"],
                                                  c["qsl"], **c["kw"])
        nbytes = kv_bytes(b, keys) // 2
        outs, times = {}, {}
        for _ in range(2):
            for name, v in VARIANTS.items():
                use(v)
                out = torch.empty_like(c["q"])
                fn = rlt_call(c, out, 0)
                fn()
                torch.cuda.synchronize()
                outs[name] = out.clone()
                times.setdefault(name, []).append(cuda_time_ms(fn) * 1e3)
                use(MAIN)
        for name in VARIANTS:
            err = (outs[name].float() - ref).abs()
            row = {"batch": b, "keys": keys, "variant": name, "us": times[name],
                   "frac_copy": nbytes / (min(times[name]) * 1e-6) / 1e9 / res["roof"]["copy_gbps"],
                   "max_err": float(err.max()), "mean_err": float(err.mean())}
            res["rows"].append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        del c
        torch.cuda.empty_cache()
    json.dump(res, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
