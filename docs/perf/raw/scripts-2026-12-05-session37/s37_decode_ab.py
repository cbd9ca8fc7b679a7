"""Session 37 A/B: the decode attention of `main` (scratch/old/rlt_kernels_main) against this tree's
(one block id per key tile, FP8 K rows unmasked, FP8 key tiles applied in pairs), at engine shapes
over HBM and with every sequence on the same few blocks (K/V resident in L2: the issue-bound time).
bf16 must give main's bits; FP8's error against the fp32 reference is reported for both.

    PYTHONPATH=scratch/old:scratch:. python3 scratch/s37_decode_ab.py OUT.json
"""
import json
import sys

import torch

import rlt_kernels_main.attention as old_attention
from perf.bench_decode_attention import PLANES, engine_case, fp8_case, kv_bytes
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention as new_attention

NEW_CAP = new_attention.decode_register_cap


def shared_blocks(c, keys):
    """Every sequence's tables point at the same blocks: K/V stay in L2."""
    per_seq = -(-keys // 16)
    t = c["tables"].clone()
    t[:, :, :per_seq] = torch.arange(per_seq, dtype=torch.int32, device="cuda")
    return dict(c, tables=t)


def run(mod, c, out):
    return lambda: mod.paged_attention(c["q"], c["k"], c["v"], c["tables"], c["seq_lens"], c["qsl"], out=out,
                                       workspace=c["workspace"], decode_from=0, **c["kw"])


def main():
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "roof": measure(), "rows": []}
    import triton
    res["triton"] = triton.__version__
    print(res["device"], res["roof"]["copy_gbps"], flush=True)
    cases = [(s, False) for s in [(1, 192), (16, 192), (64, 192), (256, 192), (256, 1024), (64, 4096)]]
    cases += [((256, 192), True), ((256, 1024), True), ((64, 192), True)]
    for cache in ("fp8", "bf16"):
        for (b, keys), l2 in cases:
            base = engine_case(b, keys, key_depth=False)
            c = fp8_case(base) if cache == "fp8" else base
            if l2:
                c = shared_blocks(c, keys)
            nbytes = kv_bytes(b, keys) // (2 if cache == "fp8" else 1)
            variants = {"main": (old_attention, None), "new": (new_attention, NEW_CAP),
                        "new_nocap": (new_attention, lambda *a: None)}
            outs, times = {}, {}
            for rnd in range(2):
                for name, (mod, cap) in variants.items():
                    if cap is not None:
                        new_attention.decode_register_cap = cap
                    out = torch.empty_like(c["q"])
                    fn = run(mod, c, out)
                    fn()
                    torch.cuda.synchronize()
                    outs[name] = out.clone()
                    times.setdefault(name, []).append(cuda_time_ms(fn) * 1e3)
                    new_attention.decode_register_cap = NEW_CAP
            ref = old_attention.paged_attention_reference(c["q"].float(), c["k"], c["v"], c["tables"], c["seq_lens"],
                                                          c["qsl"], **c["kw"])
            for name in variants:
                err = (outs[name].float() - ref).abs()
                row = {"cache": cache, "batch": b, "keys": keys, "l2": l2, "code": name, "us": times[name],
                       "frac_copy": nbytes / (min(times[name]) * 1e-6) / 1e9 / res["roof"]["copy_gbps"],
                       "same_bits_as_main": bool(torch.equal(outs[name], outs["main"])),
                       "max_err": float(err.max()), "mean_err": float(err.mean())}
                res["rows"].append(row)
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    json.dump(res, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
