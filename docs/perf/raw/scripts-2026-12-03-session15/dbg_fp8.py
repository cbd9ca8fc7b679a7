import sys; sys.path.insert(0, "tests/kernels"); sys.path.insert(0, "tests")
import torch
from test_rope_paged_attention import *
from rlt_kernels import kv_cache
from rlt_kernels.fp8 import quantize_fp8
from rlt_kernels.norms import apply_rope_reference
batch = 8
setup = dict(heads=16, kv_heads=16, head_dim=128, dtype=torch.bfloat16, cache_dtype=FP8_DTYPE)
g = torch.Generator().manual_seed(batch)
seq_lens = torch.randint(1, 2100, (batch,), generator=g).tolist()
p = decode_pass(seq_lens, device="cuda", table_blocks=65536 // BLOCK, seed=batch, **setup)
b = clone_caches(p)
kv_cache.rope_kv_scatter(p["q"], p["k"], p["v"], p["positions"], p["cos_sin"], b["k_cache"], b["v_cache"], p["slot_mapping"], **p["scales"])
c = clone_caches(p)
kv_cache.rope_kv_scatter_reference(p["q"], p["k"], p["v"], p["positions"], p["cos_sin"], c["k_cache"], c["v_cache"], p["slot_mapping"], **p["scales"])
d = (b["k_cache"].view(torch.uint8) != c["k_cache"].view(torch.uint8)).nonzero()
own = {int(s): i for i, s in enumerate(p["slot_mapping"].tolist())}
krot = apply_rope_reference(p["k"], p["positions"], p["cos_sin"])
print("diffs", d.shape[0])
for blk, off, h, dd in d[:8].tolist():
    row = own.get(blk * 16 + off)
    y = krot[row, h, dd].float() / p["scales"]["k_scale"][h]
    print(row, h, dd, "krot", krot[row, h, dd].item(), "y", y.item(), "kernel", b["k_cache"][blk, off, h, dd].float().item(),
          "ref", c["k_cache"][blk, off, h, dd].float().item(), "y->fp8 gpu", y.to(FP8_DTYPE).float().item(), "cpu", y.cpu().to(FP8_DTYPE).float().item(),
          "div cpu", (krot[row, h, dd].float().cpu() / p["scales"]["k_scale"][h].cpu()).item())
