import sys; sys.path.insert(0, "tests/kernels"); sys.path.insert(0, "tests")
import torch
from test_rope_paged_attention import *
from rlt_kernels import attention
batch = 8
setup = dict(heads=16, kv_heads=16, head_dim=128, dtype=torch.bfloat16)
g = torch.Generator().manual_seed(batch)
seq_lens = torch.randint(1, 2100, (batch,), generator=g).tolist()
print("seq_lens", seq_lens)
p = decode_pass(seq_lens, device="cuda", table_blocks=65536 // BLOCK, seed=batch, **setup)
kw = dict(workspace=attention.new_attention_workspace(batch, 16, 128, 65536, device="cuda"), range_counters=new_range_counters("cuda"))
b = clone_caches(p); expected = two_kernels(b, "neox", **kw)
own = {(int(s) // 16, int(s) % 16): i for i, s in enumerate(p["slot_mapping"].tolist())}
for it in range(3):
    a = clone_caches(p); out = fused(a, "neox", **kw)
    torch.cuda.synchronize()
    d = (a["k_cache"].view(torch.int16) != b["k_cache"].view(torch.int16))
    idx = d.nonzero()
    print("iter", it, "out same", torch.equal(out.view(torch.int16), expected.view(torch.int16)), "k diffs", idx.shape[0],
          "v diffs", (a["v_cache"].view(torch.int16) != b["v_cache"].view(torch.int16)).sum().item())
    rows = {}
    for blk, off, h, dd in idx.tolist():
        rows.setdefault((blk, off), set()).add(h)
    for (blk, off), hs in list(rows.items())[:10]:
        print("  slot", blk, off, "own row", own.get((blk, off)), "heads", sorted(hs)[:20], "n", len(hs))
    if idx.shape[0]:
        blk, off, h, dd = idx[0].tolist()
        print("  a", a["k_cache"][blk, off, h, :8].tolist(), "\n  b", b["k_cache"][blk, off, h, :8].tolist(), "\n  p", p["k_cache"][blk, off, h, :8].tolist())
