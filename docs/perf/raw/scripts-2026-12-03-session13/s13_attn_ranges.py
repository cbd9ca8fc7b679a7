"""Split decode attention with tables as wide as Ouro's 64K context: range programs per SM."""
import json, sys
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import attention as attn
from rlt_kernels.attention import paged_attention, new_range_counters, new_attention_workspace
H, D, P, BS, WIDTH = 16, 128, 4, 16, 4096
rows = []
for batch, keys in [(1, 192), (1, 1024), (1, 4096), (1, 32768), (16, 192), (16, 1024), (16, 4096), (16, 32768), (8, 192), (64, 192)]:
    g = torch.Generator(device="cuda").manual_seed(0)
    per = -(-keys // BS)
    nb = batch * per
    k = torch.randn(nb, BS, H, D, device="cuda", generator=g).bfloat16()
    v = torch.randn(nb, BS, H, D, device="cuda", generator=g).bfloat16()
    tables = torch.full((P, batch, WIDTH), -1, dtype=torch.int32, device="cuda")
    for p in range(P):
        tables[p, :, :per] = torch.randperm(nb, device="cuda", generator=g).int().view(batch, per)
    q = torch.randn(batch, H, D, device="cuda", generator=g).bfloat16()
    sl = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    ws = new_attention_workspace(batch, H, D, WIDTH * BS, device="cuda")
    rc = new_range_counters("cuda")
    kw = dict(query_depth=P - 1)
    ref = None
    for per_sm in (4, 1e9, 1, 2):
        attn.DECODE_RANGE_PROGRAMS_PER_SM = per_sm
        for tiles_small in (2, 1):
            attn.DECODE_TILES_SMALL_LAUNCH = tiles_small
            out = torch.empty_like(q)
            fn = lambda: paged_attention(q, k, v, tables, sl, qsl, out=out, workspace=ws, decode_from=0,
                                         range_counters=rc, **kw)
            ms = cuda_time_ms(fn)
            bits = out.view(torch.int16).clone()
            if ref is None:
                ref = bits
            rows.append({"batch": batch, "keys": keys, "per_sm": per_sm, "tiles_small": tiles_small, "us": ms * 1e3,
                         "frac": 2 * batch * keys * H * D * 2 / (ms * 1e-3) / 4.15e12, "same_bits": bool(torch.equal(bits, ref))})
            print(rows[-1], flush=True)
    attn.DECODE_TILES_SMALL_LAUNCH = 2
json.dump(rows, open(sys.argv[1], "w"))
