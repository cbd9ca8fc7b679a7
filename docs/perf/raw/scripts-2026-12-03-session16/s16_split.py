"""Decode chain (engine variant) with other key-range sizes (DEFAULT_SPLIT_SIZE), batches 1/4/16."""
import json, sys
import torch
from perf import bench_decode_chain as cb
from rlt_kernels import attention
res = {}
for split in (1024, 256, 128, 64):
    attention.DEFAULT_SPLIT_SIZE = split
    for b in (1, 4, 16):
        chain = cb.Chain(b)
        ms, _ = cb.time_variant(chain, cb.VARIANTS[cb.ENGINE_VARIANT])
        res[f"{split} {b}"] = ms
        print(f"split {split:5d} batch {b:3d} {ms:7.3f} ms", flush=True)
        del chain
        torch.cuda.empty_cache()
json.dump(res, open(sys.argv[1], "w"), indent=1)
