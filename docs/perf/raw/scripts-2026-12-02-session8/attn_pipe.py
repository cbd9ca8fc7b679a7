"""Decode attention: compiler-pipelined K/V stages (RLT_DECODE_PIPE), heads-first launch order; bits vs default."""
import json, math, os, sys
import torch
from perf.bench_decode_attention import engine_case, kv_bytes, rlt_call
from perf.conftest import cuda_time_ms
from perf.roofline import measure

out_dir = sys.argv[1]
roof = measure()
KNOBS = ("RLT_DECODE_MAXNREG", "RLT_DECODE_TILES", "RLT_DECODE_HEADS_FIRST", "RLT_DECODE_PIPE")
variants = [("default", {})] + [(f"pipe{s}", {"RLT_DECODE_PIPE": str(s)}) for s in (2, 3, 4, 6, 8)] + [
    ("heads first", {"RLT_DECODE_HEADS_FIRST": "1"}), ("pipe4 heads first", {"RLT_DECODE_PIPE": "4", "RLT_DECODE_HEADS_FIRST": "1"}),
    ("pipe6 heads first", {"RLT_DECODE_PIPE": "6", "RLT_DECODE_HEADS_FIRST": "1"})]
rows = []
for batch, keys in [(1, 192), (16, 192), (64, 192), (256, 192), (256, 1024), (64, 4096)]:
    c = engine_case(batch, keys)
    nb = kv_bytes(batch, keys)
    base = None
    for name, env in variants:
        for k in KNOBS:
            os.environ.pop(k, None)
        os.environ.update(env)
        o = torch.empty_like(c["q"])
        fn = rlt_call(c, o, 0)
        try:
            fn(); torch.cuda.synchronize()
            ms = cuda_time_ms(fn)
        except Exception as e:  # noqa: BLE001
            print(json.dumps(dict(batch=batch, keys=keys, variant=name, error=f"{type(e).__name__}: {str(e)[:300]}")), flush=True)
            continue
        if base is None:
            base = o.clone()
        row = dict(batch=batch, keys=keys, variant=name, env=env, us=ms * 1e3, frac=nb / (ms * 1e-3) / 1e9 / roof["copy_gbps"],
                   same_bits=bool(torch.equal(o, base)))
        rows.append(row)
        print(json.dumps(row), flush=True)
    del c
for k in KNOBS:
    os.environ.pop(k, None)
json.dump(dict(roofline=roof, rows=rows), open(os.path.join(out_dir, "attn_pipe.json"), "w"), indent=1)
# The variant with the best geometric-mean speed over batches >= 16 whose bits equal the default's everywhere.
score = {}
for name, env in variants:
    rs = [r for r in rows if r["variant"] == name]
    ds = {(r["batch"], r["keys"]): r["us"] for r in rows if r["variant"] == "default"}
    if len(rs) < len(ds) or not all(r["same_bits"] for r in rs):
        continue
    score[name] = math.exp(sum(math.log(ds[(r["batch"], r["keys"])] / r["us"]) for r in rs if r["batch"] >= 16) / sum(1 for r in rs if r["batch"] >= 16))
best = max(score, key=score.get)
print("SCORES", json.dumps(score))
print("BEST", best)
open(os.path.join(out_dir, "best_env.sh"), "w").write("".join(f"export {k}={v}\n" for k, v in dict(variants)[best].items()))
