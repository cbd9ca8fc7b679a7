"""Session 36 A/B: RoPE + K/V write fused into the decode launch, `main`'s kernel (scratch/old) against
this tree's (block ids looked up before the fused prologue; FP8 full launches capped at 96 registers),
each fused and as two kernels. Every variant must give the same bits (output and caches).

    PYTHONPATH=scratch/old:scratch:. python3 scratch/s36_rope_ab.py OUT.json
"""
import json
import sys

import torch

import rlt_kernels_main.attention as old_attention
from perf.bench_decode_attention import engine_case, fp8_case
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention as new_attention
from s36_decode_ab import rope_inputs  # the same RoPE inputs as the register-cap A/B


def main():
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "roof": measure(), "rows": []}
    print(res["device"], res["roof"]["copy_gbps"], flush=True)
    for cache in ("fp8", "bf16"):
        for b, keys in [(1, 192), (16, 192), (64, 192), (256, 192), (256, 1024)]:
            base = engine_case(b, keys, key_depth=False)
            c = fp8_case(base) if cache == "fp8" else base
            kn, vn, pos, cs, slots = rope_inputs(c, keys)
            k0, v0 = c["k"].clone(), c["v"].clone()
            got, times = {}, {}
            for rnd in range(2):
                for name, mod in (("main", old_attention), ("new", new_attention)):
                    for fused in (False, True):
                        out = torch.empty_like(c["q"])

                        def fn(mod=mod, fused=fused, out=out):
                            mod.FUSED_ROPE_BELOW_PROGRAMS_PER_SM = 10**9 if fused else 2
                            return mod.rope_paged_attention(c["q"], kn, vn, pos, cs, c["k"], c["v"], slots,
                                                            c["tables"], c["seq_lens"], c["qsl"], out=out,
                                                            workspace=c["workspace"], **c["kw"])
                        c["k"].copy_(k0)
                        c["v"].copy_(v0)
                        fn()
                        torch.cuda.synchronize()
                        got[(name, fused)] = (out.clone(), c["k"].clone(), c["v"].clone())
                        times.setdefault((name, fused), []).append(cuda_time_ms(fn) * 1e3)
                        mod.FUSED_ROPE_BELOW_PROGRAMS_PER_SM = 2
            ref = got[("main", False)]
            for key, t in times.items():
                row = {"cache": cache, "batch": b, "keys": keys, "code": key[0], "fused": key[1], "us": t,
                       "same_bits": all(torch.equal(x, y) for x, y in zip(got[key], ref))}
                res["rows"].append(row)
                print(row, flush=True)
    json.dump(res, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
