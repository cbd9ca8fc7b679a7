"""Balanced column spans against the 64-row decode tiles: us per call from HBM (rotating copies), bits compared."""
import dataclasses, functools, itertools, json, sys
import torch
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import gemm
from rlt_kernels.fp8 import FP8_DTYPE, quantize_weight_fp8

out_path = sys.argv[1]
roof = measure()
WEIGHTS = [("qkv", 6144, 2048, None), ("gate_up", 11264, 2048, "swiglu"), ("huginn.proj", 5280, 5280, None),
           ("o", 2048, 2048, None)]
res = {"roofline": roof, "rows": []}
for fp8 in (False, True):
    for name, n, k, act in WEIGHTS:
        if fp8 and name == "huginn.proj":
            continue
        w0 = torch.randn(n, k, device="cuda") * k**-0.5
        if fp8:
            w8, sc = quantize_weight_fp8(w0)
            copies = [(w8, sc)] + [(w8.clone(), sc.clone()) for _ in range(max(1, min(32, 512 * 2**20 // w8.nbytes)) - 1)]
        else:
            wb = w0.bfloat16()
            copies = [(wb, None)] + [(wb.clone(), None) for _ in range(max(1, min(32, 512 * 2**20 // wb.nbytes)) - 1)]
        del w0
        nbytes = copies[0][0].nbytes
        n_out = n // 2 if act else n
        for m in (1, 16, 64):
            rule = gemm.linear_config(n, k, torch.bfloat16, act, m, FP8_DTYPE if fp8 else None)
            old = dataclasses.replace(rule, column_spans=0)
            cands = [old, dataclasses.replace(old, column_spans=132)]
            for st in (2, 3, 4, 5, 6):
                c = dataclasses.replace(old, column_spans=132, num_stages=st)
                if c not in cands and st != old.num_stages:
                    cands.append(c)
            if rule.split_k == 1 and not act:
                cands.append(dataclasses.replace(old, column_spans=264, num_stages=3))
            x = torch.randn(m, k, device="cuda").bfloat16()
            outb = torch.empty(m, n_out, device="cuda", dtype=torch.bfloat16)
            ref = gemm._launch(x, copies[0][0], torch.empty_like(outb), None, act, old, copies[0][1]).clone()
            for cfg in cands:
                try:
                    got = gemm._launch(x, copies[0][0], torch.empty_like(outb), None, act, cfg, copies[0][1])
                    same = bool(torch.equal(got.view(torch.int16), ref.view(torch.int16)))
                    calls = [functools.partial(gemm._launch, x, w, outb, None, act, cfg, s) for w, s in copies]
                    it = itertools.cycle(calls)
                    us = cuda_time_ms(lambda: next(it)(), iters=40) * 1e3
                except Exception as e:  # noqa
                    print(name, m, cfg, "ERROR", repr(e)[:200], flush=True)
                    continue
                row = dict(weight=name, fp8=fp8, m=m, spans=cfg.column_spans, stages=cfg.num_stages, us=us,
                           of_copy=nbytes / (us * 1e-6) / 1e9 / roof["copy_gbps"], same_bits=same, rule=cfg == rule)
                res["rows"].append(row)
                print(f"{name:12s} fp8={fp8:d} M={m:3d} spans={cfg.column_spans:3d} stages={cfg.num_stages} {us:7.2f} us "
                      f"{row['of_copy']:5.1%} bits={'same' if same else 'DIFFER'}{' <rule' if row['rule'] else ''}", flush=True)
        del copies
        torch.cuda.empty_cache()
json.dump(res, open(out_path, "w"), indent=1)
