"""TMA rule vs cp.async tiles at every model weight (M = 128, 256, 512, 2048): time and bits."""
import functools, itertools, json, os
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm
from rlt_kernels.fp8 import FP8_DTYPE, quantize_weight_fp8
DT = torch.bfloat16
FP8 = os.environ.get("FP8") == "1"
WD = FP8_DTYPE if FP8 else None
W = [("ouro.qkv", 6144, 2048, None), ("ouro.o", 2048, 2048, None), ("ouro.gate_up", 11264, 2048, "swiglu"),
     ("ouro.down", 2048, 5632, None), ("ouro.lm_head", 49152, 2048, None), ("huginn.Wqkv", 15840, 5280, None),
     ("huginn.proj", 5280, 5280, None), ("huginn.fc", 35840, 5280, "swiglu"), ("huginn.mlp_proj", 5280, 17920, None)]
res = {}
for name, n, k, act in W:
    n_out = n // 2 if act else n
    w0 = torch.randn(n, k, dtype=DT, device="cuda") * k ** -0.5
    sc = None
    if FP8:
        w0, sc = quantize_weight_fp8(w0)
    ws = [w0] + [w0.clone() for _ in range(max(1, min(8, (512 << 20) // w0.nbytes)) - 1)]
    line = []
    for m in (128, 256, 512, 2048):
        x = torch.randn(m, k, dtype=DT, device="cuda"); out = torch.empty(m, n_out, dtype=DT, device="cuda")
        r = {}
        for label, cfg in (("tma", gemm.linear_config(n, k, DT, act, m, WD)), ("plain", gemm.linear_config(n, k, DT, act, m, WD, tma=False))):
            it = itertools.cycle([functools.partial(gemm._launch, x, w, out, None, act, cfg, sc) for w in ws])
            r[label] = cuda_time_ms(lambda: next(it)(), iters=20) * 1e3
        a = gemm._launch(x, w0, torch.empty_like(out), None, act, gemm.linear_config(n, k, DT, act, m, WD), sc)
        b = gemm._launch(x, w0, torch.empty_like(out), None, act, gemm.linear_config(n, k, DT, act, m, WD, tma=False), sc)
        r["same_bits"] = bool(torch.equal(a, b))
        one = gemm.linear(x[:1], w0, activation=act, weight_scale=sc)
        r["row0_same_as_decode"] = bool(torch.equal(a[:1], one))
        res.setdefault(name, {})[m] = r
        line.append(f"M{m} {r['plain']:.1f}->{r['tma']:.1f} {'ok' if r['same_bits'] and r['row0_same_as_decode'] else 'BITS DIFFER'}")
    print(name, "; ".join(line), flush=True)
    del ws, w0
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), f"rule_check{'_fp8' if FP8 else ''}.json"), "w"), indent=1)
