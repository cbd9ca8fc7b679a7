"""Decode attention (engine shapes) at small batches with several split sizes."""
import json, sys
import torch
from perf.bench_decode_attention import engine_case, kv_bytes
from perf.conftest import cuda_time_ms
from rlt_kernels import attention
from rlt_kernels.attention import paged_attention, new_range_counters, new_attention_workspace
rows = []
for batch, keys in [(1, 192), (1, 512), (16, 192), (64, 192), (256, 192)]:
    c = engine_case(batch, keys)
    for split in (1024, 256, 128, 64):
        out = torch.empty_like(c["q"])
        rc = new_range_counters("cuda")
        ws = new_attention_workspace(batch, 16, 128, c["tables"].shape[2] * 16, split_size=split, device="cuda")
        fn = lambda: paged_attention(c["q"], c["k"], c["v"], c["tables"], c["seq_lens"], c["qsl"], out=out,
                                     workspace=ws, decode_from=0, split_size=split, range_counters=rc, **c["kw"])
        try:
            ms = cuda_time_ms(fn)
            bits = out.view(torch.int16).clone()
            rows.append({"batch": batch, "keys": keys, "split": split, "us": ms * 1e3})
        except Exception as e:
            rows.append({"batch": batch, "keys": keys, "split": split, "error": str(e)[:300]})
        print(rows[-1], flush=True)
json.dump(rows, open(sys.argv[1], "w"))
