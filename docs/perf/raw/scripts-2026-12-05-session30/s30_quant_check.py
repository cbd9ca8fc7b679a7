"""FP8 weight scales: host vs GPU, Python-scalar division vs tensor division (session 30)."""
import torch
from rlt_kernels.fp8 import quantize_weight_fp8, FP8_MAX
g = torch.Generator().manual_seed(0)
w = (torch.randn(6144, 2048, generator=g) * 0.02).to(torch.bfloat16)
amax = w.float().abs().amax(dim=1)
old_cpu, old_gpu = amax / FP8_MAX, (amax.cuda() / FP8_MAX).cpu()
new_cpu, new_gpu = amax / torch.full_like(amax, FP8_MAX), (amax.cuda() / torch.full_like(amax.cuda(), FP8_MAX)).cpu()
print("old scalar division: rows differing host vs GPU", int((old_cpu != old_gpu).sum()), "of", amax.numel())
print("tensor division: rows differing host vs GPU", int((new_cpu != new_gpu).sum()))
d_c, s_c = quantize_weight_fp8(w)
d_g, s_g = quantize_weight_fp8(w.cuda())
print("quantize_weight_fp8 host vs GPU: data equal", torch.equal(d_c.view(torch.uint8), d_g.cpu().view(torch.uint8)),
      "scales equal", torch.equal(s_c, s_g.cpu()))
