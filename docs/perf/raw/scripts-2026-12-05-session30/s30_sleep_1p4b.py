"""Sleep mode on the ouro-1.4b replica (bf16, graphs): memory given back, sleep and wake times, same outputs."""
import json, sys, time
import torch
from rlt_runtime import LLM, SamplingParams
llm = LLM("ouro-1.4b", dtype="bfloat16", execution_mode="graphs", enable_sleep_mode=True, max_num_seqs=64,
          gpu_memory_utilization=0.5)
p = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
prompts = [list(range(10 + i, 110 + i)) for i in range(8)]
run = lambda: [o.outputs[0].token_ids for o in llm.generate(prompts, p, use_tqdm=False)]
before = run()
out = {}
for level in (1, 2):
    torch.cuda.synchronize(); held = torch.cuda.memory_allocated(); reserved = torch.cuda.memory_reserved()
    t = time.perf_counter(); given = llm.sleep(level=level); t_sleep = time.perf_counter() - t
    asleep = torch.cuda.memory_allocated(); asleep_reserved = torch.cuda.memory_reserved()
    t = time.perf_counter(); llm.wake_up(); torch.cuda.synchronize(); t_wake = time.perf_counter() - t
    same = run() == before if level == 1 else None
    out[level] = dict(bytes_released=given, allocated_gib=[held / 2**30, asleep / 2**30],
                      reserved_gib=[reserved / 2**30, asleep_reserved / 2**30], sleep_s=t_sleep, wake_s=t_wake,
                      same_outputs=same)
    print(json.dumps({"level": level, **out[level]}), flush=True)
print(json.dumps(llm.engine.executor.graph_stats()["graphs"]))
