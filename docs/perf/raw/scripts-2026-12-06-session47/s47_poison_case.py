"""A conformance case on CPU, every kernel under the Triton interpreter, with fresh float buffers
(torch.empty / empty_like / new_empty) filled with POISON (nan, inf, big, zero):
    TRITON_INTERPRET=1 python scratch/s47_poison_case.py CASE.json OUT.json POISON"""
import json, sys
import torch
poison = {"nan": float("nan"), "inf": float("inf"), "big": 1e30, "zero": 0.0}[sys.argv[3]]
_empty, _empty_like, _new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty
def fill(t):
    if t.is_floating_point() and t.numel():
        t.fill_(poison)
    return t
torch.empty = lambda *a, **k: fill(_empty(*a, **k))
torch.empty_like = lambda *a, **k: fill(_empty_like(*a, **k))
torch.Tensor.new_empty = lambda self, *a, **k: fill(_new_empty(self, *a, **k))
import perf.conformance_case as cc
for name in ("engine_options", "alone_options"):
    f = getattr(cc, name)
    setattr(cc, name, lambda *a, _f=f, **kw: dict(_f(*a, **kw), attention_backend="triton"))
case = json.load(open(sys.argv[1]))
res = cc.run_case(case)
json.dump(res, open(sys.argv[2], "w"), default=str)
print(res["status"], res["detail"][:600], res.get("stats"), flush=True)
