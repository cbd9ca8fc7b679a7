"""Run one engine scenario on the GPU (used to localise device faults): python -m perf.gpu_debug NAME."""
import sys
import traceback

import torch

from rlt_runtime import LLM, SamplingParams

SCENARIOS = {
    "eager_fp32": dict(model="ouro-tiny", dtype="float32", execution_mode="eager", async_scheduling=False),
    "eager_bf16": dict(model="ouro-tiny", dtype="bfloat16", execution_mode="eager", async_scheduling=False),
    "graphs_sync": dict(model="ouro-tiny", dtype="bfloat16", execution_mode="graphs", async_scheduling=False),
    "graphs_async": dict(model="ouro-tiny", dtype="bfloat16", execution_mode="graphs", async_scheduling=True),
    "huginn_eager": dict(model="huginn-tiny", dtype="bfloat16", execution_mode="eager", async_scheduling=False),
    "ouro14_eager": dict(model="ouro-1.4b", dtype="bfloat16", execution_mode="eager", async_scheduling=False,
                         max_num_seqs=8),
}

if __name__ == "__main__":
    name = sys.argv[1]
    kw = dict(SCENARIOS[name])
    model = kw.pop("model")
    try:
        llm = LLM(model, max_num_seqs=kw.pop("max_num_seqs", 8), **kw)
        print(name, "engine up", llm.stats()["memory_plan"]["num_blocks"], flush=True)
        outs = llm.generate([list(range(5, 40)), [40, 41, 42], [100]],
                            SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, exit_threshold=0.6), use_tqdm=False)
        torch.cuda.synchronize()
        print(name, "OK", [o.outputs[0].token_ids for o in outs], [o.outputs[0].exit_depths for o in outs], flush=True)
    except Exception:
        print(name, "FAILED", flush=True)
        traceback.print_exc()
