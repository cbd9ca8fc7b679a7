"""The engine's prefill attention call (captured from a real prefill step), timed as the engine
runs it and with one input simplified at a time, beside the microbenchmark's plain case."""
import json, sys, time
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels.attention import paged_attention
from rlt_runtime import LLM, SamplingParams
from rlt_runtime.entrypoints.bench_offline import random_prompts

out_path = sys.argv[1]
llm = LLM("ouro-1.4b", dtype="bfloat16", max_num_seqs=256, execution_mode="eager")
runner = llm.engine.executor.worker.runner
ops = runner.ops
calls = []
orig = ops.paged_attention

def rec(*a, **kw):
    if len(calls) < 8:
        calls.append((a, dict(kw)))
    return orig(*a, **kw)

ops.paged_attention = rec
eng = llm.engine
params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
for i, p in enumerate(random_prompts(2, 2048, eng.model_config.vocab_size, seed=3)):
    eng.add_request(f"p{i}", p, params)
eng.step()
torch.cuda.synchronize()
ops.paged_attention = orig
res = {}
for idx in (0, 3, 7):
    a, kw = calls[idx]
    q, k, v, tables, seq_lens, qsl = a
    info = {"q": list(q.shape), "k": list(k.shape), "k_stride": list(k.stride()), "tables": list(tables.shape),
            "seq_lens": list(seq_lens.shape), "qsl": list(qsl.shape),
            "kw": {n: (list(t.shape) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}}
    print(idx, info, flush=True)
    base_kw = {n: t for n, t in kw.items() if n != "range_counters"}
    variants = {"engine": base_kw}
    variants["no key depth"] = dict(base_kw, key_depth=None)
    variants["no decode_from"] = dict(base_kw, decode_from=None)
    variants["no key depth, no decode_from"] = dict(base_kw, key_depth=None, decode_from=None)
    n_live = int(kw["active_seqs"][0]) if isinstance(kw.get("active_seqs"), torch.Tensor) else None
    r = {"info": info}
    for name, v_kw in variants.items():
        o = torch.empty_like(q)
        fn = lambda: paged_attention(q, k, v, tables, seq_lens, qsl, out=o, **{n: t for n, t in v_kw.items() if n != "out"})
        try:
            r[name] = cuda_time_ms(fn)
        except Exception as exc:
            r[name] = str(exc)[:200]
        print(idx, name, r[name], flush=True)
    # live sequences only (no padded sequence slots)
    if n_live:
        sl = seq_lens[:n_live].clone(); qs = qsl[:n_live + 1].clone()
        kw2 = dict(base_kw, active_seqs=None, seq_slots=kw["seq_slots"][:n_live].clone(), decode_from=None)
        o = torch.empty_like(q)
        fn = lambda: paged_attention(q, k, v, tables, sl, qs, out=o, **{n: t for n, t in kw2.items() if n != "out"})
        r["live sequences only, no decode_from"] = cuda_time_ms(fn)
        kw3 = dict(kw2, key_depth=None)
        fn = lambda: paged_attention(q, k, v, tables, sl, qs, out=o, **{n: t for n, t in kw3.items() if n != "out"})
        r["live sequences only, no decode_from, no key depth"] = cuda_time_ms(fn)
        print(idx, r, flush=True)
    res[idx] = r
json.dump(res, open(out_path, "w"), indent=1, default=str)
