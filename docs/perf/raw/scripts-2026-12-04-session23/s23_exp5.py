"""Prompt tile attention with the program order reversed (longest tiles first): same bits, time."""
import json, sys
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import attention
from scratch import attention_rev

res = {}
torch.manual_seed(0)
h, d, bs, planes = 16, 128, 16, 4
for n_seq, seq in ((2, 2048), (8, 512), (1, 4096), (4, 1024)):
    t_total = n_seq * seq
    blocks_per = seq // bs
    nb = planes * n_seq * blocks_per + 8
    kc = torch.randn(nb, bs, h, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(nb, bs, h, d, device="cuda", dtype=torch.bfloat16)
    perm = torch.randperm(nb - 8, device="cuda").int()
    wide = torch.zeros(planes, n_seq, 4096, dtype=torch.int32, device="cuda")
    wide[:, :, :blocks_per] = perm[: planes * n_seq * blocks_per].view(planes, n_seq, blocks_per)
    q = torch.randn(t_total, h, d, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.full((n_seq,), seq, dtype=torch.int32, device="cuda")
    qsl = torch.arange(0, t_total + 1, seq, dtype=torch.int32, device="cuda")
    flops = 4 * h * d * sum(i + 1 for i in range(seq)) * n_seq
    row = {}
    outs = {}
    for name, mod in (("in use", attention), ("reversed", attention_rev), ("in use again", attention), ("reversed again", attention_rev)):
        o = torch.empty_like(q)
        call = lambda o, mod=mod: mod.paged_attention(q, kc, vc, wide, seq_lens, qsl, out=o, query_depth=2)
        t = cuda_time_ms(lambda: call(o)) * 1e3
        outs[name] = call(torch.empty_like(q))
        row[name] = {"us": round(t, 1), "tflops": round(flops / t / 1e6, 1)}
    row["same_bits"] = bool(torch.equal(outs["in use"].view(torch.int16), outs["reversed"].view(torch.int16)))
    print(n_seq, seq, row, flush=True)
    res[f"{n_seq} x {seq}"] = row
json.dump(res, open(sys.argv[1], "w"), indent=1)
