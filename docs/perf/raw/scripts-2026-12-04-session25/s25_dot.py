"""Decode attention: the dot arithmetic (tensor cores, GP padded to 16 rows) against the per-lane
arithmetic, FP8 and bf16 caches, engine shapes (perf.bench_decode_attention's cases)."""
import json, sys, time
import torch
import torch.nn.functional as F
from perf.bench_decode_attention import engine_case, fp8_case, rlt_call, kv_bytes, dense_kv, HEADS, HEAD_DIM
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention

out_path = sys.argv[1]
cases = [(1, 192), (16, 192), (64, 192), (256, 192), (64, 1024), (256, 1024), (64, 4096), (16, 32768)]
roof = measure()
print("copy", roof["copy_gbps"], flush=True)
fp8_variants = [("lane", None, None, None)] + [("dot", k, w, t) for k in (16, 32, 64) for w in (4, 8) for t in (1, 2)]
bf16_variants = [("lane", None, None, None)] + [("dot", k, w, t) for k in (32, 64) for w in (4,) for t in (1, 2)]
rows = []
default = dict(DECODE_DOT_FP8=attention.DECODE_DOT_FP8, DECODE_DOT_16BIT=attention.DECODE_DOT_16BIT,
               DOT_KEYS=attention.DOT_KEYS, DOT_WARPS=attention.DOT_WARPS, DECODE_TILES_DOT=attention.DECODE_TILES_DOT)
def setv(cache, kind, keys, warps, tiles):
    for n, v in default.items():
        setattr(attention, n, v)
    if cache == "fp8":
        attention.DECODE_DOT_FP8 = kind == "dot"
    else:
        attention.DECODE_DOT_16BIT = kind == "dot"
    if kind == "dot":
        attention.DOT_KEYS, attention.DOT_WARPS, attention.DECODE_TILES_DOT = keys, warps, tiles
t0 = time.time()
for batch, keys in cases:
    c = engine_case(batch, keys)
    k, v = dense_kv(c, keys)
    q4 = c["q"].view(batch, HEADS, 1, HEAD_DIM)
    ref16 = F.scaled_dot_product_attention(q4.float(), k.float(), v.float()).view(batch, HEADS, HEAD_DIM)
    f8 = fp8_case(c)
    # reference over the dequantized FP8 cache
    ks, vs = f8["kw"]["k_scale"], f8["kw"]["v_scale"]
    plane = c["tables"][-1][:, : -(-keys // 16)].long()
    kd = (f8["k"].float() * ks[None, None, :, None])[plane].flatten(1, 2)[:, :keys].transpose(1, 2)
    vd = (f8["v"].float() * vs[None, None, :, None])[plane].flatten(1, 2)[:, :keys].transpose(1, 2)
    ref8 = F.scaled_dot_product_attention(q4.float(), kd, vd).view(batch, HEADS, HEAD_DIM)
    del k, v, kd, vd
    for cache, variants, inp, ref in (("fp8", fp8_variants, f8, ref8), ("bf16", bf16_variants, c, ref16)):
        bits_by_geom = {}
        for kind, dk, dw, dt in variants:
            setv(cache, kind, dk, dw, dt)
            out = torch.empty_like(c["q"])
            try:
                ms = cuda_time_ms(rlt_call(inp, out, 0))
            except Exception as exc:  # noqa: BLE001
                rows.append(dict(cache=cache, kind=kind, keys_tile=dk, warps=dw, tiles=dt, batch=batch, keys=keys,
                                 error=str(exc)[:300]))
                print(rows[-1], flush=True)
                continue
            bits = out.view(torch.int16).clone()
            geom = (kind, dk, dw)
            same = bool(torch.equal(bits, bits_by_geom.setdefault(geom, bits)))
            nbytes = kv_bytes(batch, keys) / (2 if cache == "fp8" else 1)
            err = (out.float() - ref).abs()
            rows.append(dict(cache=cache, kind=kind, keys_tile=dk, warps=dw, tiles=dt, batch=batch, keys=keys,
                             us=ms * 1e3, frac=nbytes / (ms * 1e-3) / 1e9 / roof["copy_gbps"],
                             max_err=err.max().item(), mean_err=err.mean().item(), same_bits_across_tiles=same))
            print(json.dumps(rows[-1]), flush=True)
    del c, f8
    torch.cuda.empty_cache()
    json.dump(dict(roofline=roof, rows=rows), open(out_path, "w"), indent=1)
print("done", time.time() - t0)
# summary: best dot per (cache, batch, keys) vs lane
for cache in ("fp8", "bf16"):
    for batch, keys in cases:
        rs = [r for r in rows if r["cache"] == cache and r["batch"] == batch and r["keys"] == keys and "us" in r]
        lane = [r for r in rs if r["kind"] == "lane"]
        best = sorted([r for r in rs if r["kind"] == "dot"], key=lambda r: r["us"])[:3]
        print(cache, batch, keys, "lane", lane[0]["us"] if lane else None,
              [(r["keys_tile"], r["warps"], r["tiles"], round(r["us"], 1), round(r["frac"], 2)) for r in best])
