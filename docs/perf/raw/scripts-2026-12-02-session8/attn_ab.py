"""Attention A/B: K/V rows hinted 16-element aligned (RLT_DECODE_VEC=1: 16-byte loads) against
element loads (0). Decode arithmetic and tile arithmetic at engine decode shapes, and a causal
prefill; times in CUDA graphs, errors against the fp32 reference, bits between the two."""
import json, os, sys
import torch
from perf.bench_decode_attention import engine_case, kv_bytes, rlt_call, CASES, HEADS, HEAD_DIM, PLANES, BLOCK
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention

out_dir = sys.argv[1]
roof = measure()
rows = []


def ab(fn_for, label, nbytes=None, flops=None, ref=None):
    outs, ms = {}, {}
    for vec in ("0", "1"):
        os.environ["RLT_DECODE_VEC"] = vec
        fn, o = fn_for()
        fn(); torch.cuda.synchronize()
        outs[vec] = o.clone()
        ms[vec] = cuda_time_ms(fn)
    row = dict(case=label, us_elem=ms["0"] * 1e3, us_vec=ms["1"] * 1e3, speedup=ms["0"] / ms["1"],
               same_bits=bool(torch.equal(outs["0"], outs["1"])))
    if nbytes:
        row["frac_elem"] = nbytes / (ms["0"] * 1e-3) / 1e9 / roof["copy_gbps"]
        row["frac_vec"] = nbytes / (ms["1"] * 1e-3) / 1e9 / roof["copy_gbps"]
    if flops:
        row["tflops_elem"], row["tflops_vec"] = flops / ms["0"] / 1e9, flops / ms["1"] / 1e9
    if ref is not None:
        row["max_err"] = {v: float((outs[v].float() - ref).abs().max()) for v in outs}
    rows.append(row)
    print(json.dumps(row), flush=True)


for batch, keys in CASES:
    c = engine_case(batch, keys)
    ref = None
    if batch * keys <= 64 * 4096:
        ref = attention.paged_attention_reference(c["q"].float(), c["k"].float(), c["v"].float(), c["tables"], c["seq_lens"],
                                                  c["qsl"], **c["kw"])
    for arith, df in (("decode", 0), ("tile", None)):
        def fn_for(c=c, df=df):
            o = torch.empty_like(c["q"])
            return rlt_call(c, o, df), o
        ab(fn_for, f"{arith} {batch}x{keys}", nbytes=kv_bytes(batch, keys), ref=ref)
    del c

for batch, n in ((1, 2048), (8, 2048)):
    g = torch.Generator(device="cuda").manual_seed(1)
    per = n // BLOCK
    nb = batch * per
    k = torch.randn(nb, BLOCK, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    v = torch.randn(nb, BLOCK, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    tables = torch.randperm(nb, device="cuda", generator=g).int().view(1, batch, per).repeat(PLANES, 1, 1).contiguous()
    q = torch.randn(batch * n, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    seq_lens = torch.full((batch,), n, dtype=torch.int32, device="cuda")
    qsl = torch.arange(0, batch * n + 1, n, dtype=torch.int32, device="cuda")
    kw = dict(query_depth=torch.full((batch,), PLANES - 1, dtype=torch.int32, device="cuda"),
              key_depth=torch.full((nb, BLOCK), PLANES - 1, dtype=torch.int8, device="cuda"))
    ws = attention.new_attention_workspace(batch * n, HEADS, HEAD_DIM, n, device="cuda")
    def fn_for():
        o = torch.empty_like(q)
        return (lambda: attention.paged_attention(q, k, v, tables, seq_lens, qsl, out=o, workspace=ws, **kw)), o
    flops = 4 * batch * HEADS * HEAD_DIM * n * n / 2
    ref = attention.paged_attention_reference(q.float(), k.float(), v.float(), tables, seq_lens, qsl, **kw) if batch == 1 else None
    ab(fn_for, f"prefill {batch}x{n}", flops=flops, ref=ref)

json.dump(dict(roofline=roof, rows=rows), open(os.path.join(out_dir, "attn_ab.json"), "w"), indent=1)
