"""Session 39: the tile (tensor-core) arithmetic with 16-row tiles for one-query rows, against the
decode kernel, over FP8 and bf16 caches (q bf16, or fp16 so FP8 widens with the hardware cvt).
    python3 scratch/s39_tile16.py OUT.json
"""
import json
import sys

import torch

from perf.bench_decode_attention import engine_case, fp8_case, kv_bytes, rlt_call
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention

TILE_SHAPE = attention._tile_shape
CASES = [(256, 150, True), (256, 150, False), (256, 192, True), (64, 192, True), (256, 1024, True), (16, 192, True)]


def main():
    out_path = sys.argv[1]
    roof = measure()
    res = {"device": torch.cuda.get_device_name(), "roof": roof, "rows": []}
    print(res["device"], roof["copy_gbps"], flush=True)
    try:
        for batch, keys, kd in CASES:
            c = engine_case(batch, keys, key_depth=kd)
            f8 = fp8_case(c)
            f8h = dict(f8, q=f8["q"].half())
            row = {"batch": batch, "keys": keys, "key_depth": kd}
            outs = {}
            variants = [("decode_fp8", f8, 0, 64, 8), ("tile64_fp8", f8, None, 64, 8), ("tile16_fp8", f8, None, 16, 8),
                        ("tile16_fp8_s2", f8, None, 16, 0), ("tile16_fp8_f16q", f8h, None, 16, 8),
                        ("tile16_fp8_f16q_s2", f8h, None, 16, 0), ("tile16_fp8_f16q_n32", f8h, None, 16, 8, 32),
                        ("tile16_fp8_f16q_n128", f8h, None, 16, 8, 64 * 2), ("tile16_fp8_f16q_w2", f8h, None, 16, 8, 64, 2),
                        ("tile16_fp8_f16q_w8", f8h, None, 16, 8, 64, 8),
                        ("decode_bf16", c, 0, 64, 8), ("tile16_bf16", c, None, 16, 8), ("tile16_bf16_s2", c, None, 16, 0)]
            for name, case, dfrom, min_rows, few, *rest in variants:
                key_tile = rest[0] if rest else 64
                warps = rest[1] if len(rest) > 1 else None
                attention.KEY_TILE = key_tile
                attention._tile_shape = TILE_SHAPE if warps is None else (
                    lambda *a, _w=warps, **kw: dict(TILE_SHAPE(*a, **kw), num_warps=_w))
                attention.MIN_TILE_ROWS = min_rows
                attention.FEW_QUERIES_PER_SEQ = few
                out = torch.empty_like(case["q"])
                try:
                    ms = cuda_time_ms(rlt_call(case, out, dfrom))
                except Exception as exc:  # noqa: BLE001
                    row[name] = str(exc)[:300]
                    continue
                outs[name] = out.float()
                nbytes = kv_bytes(batch, keys) // (2 if "fp8" in name else 1)
                ref = outs["decode_fp8" if "fp8" in name else "decode_bf16"]
                row[name] = [round(ms * 1e3, 2), round(nbytes / (ms * 1e-3) / 1e9 / roof["copy_gbps"], 3),
                             float((outs[name] - ref).abs().max())]
            attention.MIN_TILE_ROWS, attention.FEW_QUERIES_PER_SEQ, attention.KEY_TILE = 64, 8, 64
            attention._tile_shape = TILE_SHAPE
            print(json.dumps(row), flush=True)
            res["rows"].append(row)
            del c, f8, f8h
    finally:
        json.dump(res, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
