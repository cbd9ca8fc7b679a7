"""CPU (interpreter, one program) check of the spike against its torch reference, with the natural
sensitivity of the step (reference against itself with 1-ulp noise on the input) beside it."""
import os, sys, time
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(__file__))
import torch
from persistent import Model, Runner, reference

m = Model(H=1024, NH=8, HD=128, F=1024, L=2, loops=2, keys=37, maxk=64, device="cpu")
kc0, vc0 = m.kc.clone(), m.vc.clone()
r = Runner(m, programs=1, ahead=0)
t = time.time()
out = r.launch().clone()
print("kernel s", round(time.time() - t, 1), "counters", r.counters.tolist())
ref = reference(m, kc0.clone(), vc0.clone(), d_range=r.d_range)
rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
print("kernel vs reference rel", rel(out, ref))
h0 = m.h0.clone()
m.h0 = (h0.float() * (1 + 2 ** -8 * torch.randn(h0.shape, generator=torch.Generator().manual_seed(1)).sign())).to(torch.bfloat16)
print("reference, input 1-ulp noise, rel", rel(reference(m, kc0.clone(), vc0.clone(), d_range=r.d_range), ref))
m.h0 = h0
m.keys -= 1
print("reference with one key fewer, rel", rel(reference(m, kc0.clone(), vc0.clone(), d_range=r.d_range), ref))
