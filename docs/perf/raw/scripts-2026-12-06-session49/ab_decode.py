"""Session 49: the FP8 decode call, tensor-core loop (DECODE_MMA) against the CUDA-core loop, same lease."""
import json
import sys

import torch

from perf.bench_decode_attention import engine_call, engine_case, fp8_case, kv_bytes, new_tokens, rlt_call
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention

CASES = [(1, 192), (16, 192), (64, 192), (256, 150), (256, 192), (256, 1024), (64, 4096), (16, 32768)]


def main(path):
    roof = measure()
    res = {"copy_gbps": roof["copy_gbps"], "device": torch.cuda.get_device_name(), "cases": []}
    for key_depth, resident in ((False, False), (False, True), (True, False)):
        for b, k in CASES:
            if (key_depth or resident) and (b, k) not in ((256, 150), (256, 192)):
                continue
            c = fp8_case(engine_case(b, k, key_depth=key_depth))
            if resident:  # every row on row 0's blocks: K/V stay in L2, the instruction-bound time
                per_seq = -(-k // 16)
                c["tables"][:, :, :per_seq] = c["tables"][:, :1, :per_seq].clone()
            new = new_tokens(c, k)
            row = {"batch": b, "keys": k, "key_depth": key_depth, "l2_resident": resident,
                   "fp8_bytes": kv_bytes(b, k) // 2}
            outs = {}
            for mma in (False, True):
                attention.DECODE_MMA = mma
                out = torch.empty_like(c["q"])
                ms = cuda_time_ms(rlt_call(c, out, 0))
                row.setdefault(f"decode_us_mma{int(mma)}", []).append(round(ms * 1e3, 2))
                outs[mma] = out.clone()
                eo = torch.empty_like(c["q"])
                ms = cuda_time_ms(engine_call(c, new, eo))
                row.setdefault(f"engine_us_mma{int(mma)}", []).append(round(ms * 1e3, 2))
            row["max_diff"] = (outs[True].float() - outs[False].float()).abs().max().item()
            best = min(row["decode_us_mma1"])
            row["mma_frac_copy"] = row["fp8_bytes"] / (best * 1e-6) / 1e9 / roof["copy_gbps"]
            res["cases"].append(row)
            print(json.dumps(row), flush=True)
    attention.DECODE_MMA = True
    json.dump(res, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
