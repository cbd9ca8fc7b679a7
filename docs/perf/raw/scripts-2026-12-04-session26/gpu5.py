"""Session 26, call 5: what the engine's live-row count costs the decode chain (every launch reads an
int32 count before its loads: active_rows / active_seqs), batch 1-64, A/B in one process."""
import json, os, time
import torch
from perf import bench_decode_chain as bdc

OUT = os.environ.get("OUT", "out")
res = {"chain": []}
t0 = time.time()
for b in (1, 4, 16, 64):
    chain = bdc.Chain(b)
    ref = None
    for r in range(3):
        for live in (None, b):
            chain.set_live(live)
            ms, out = bdc.time_variant(chain, bdc.VARIANTS[bdc.ENGINE_VARIANT])
            ref = out if ref is None else ref
            row = {"batch": b, "round": r, "live_count": live is not None, "ms": ms, "same_bits": bool(torch.equal(out, ref))}
            res["chain"].append(row)
            print(row, flush=True)
    del chain
    torch.cuda.empty_cache()
res["seconds"] = time.time() - t0
json.dump(res, open(f"{OUT}/s26_gpu5.json", "w"), indent=1)
