"""Trace the greedy round decisions of the adaptive policy on the GPU (ouro-1.4b, synthetic acceptance)."""
import json, sys, time
import torch
from perf.bench_speculative import preset_checkpoint, end_to_end
from rlt_runtime import LLM
import rlt_runtime.engine.greedy_rounds as gr

orig = gr.GreedyRounds.drafts
log = []

def traced(self, expected, fixed_tokens, fixed_k, rows):
    k = orig(self, expected, fixed_tokens, fixed_k, rows)
    b = self.costs.bucket(rows)
    rel = {c: self.costs.relative(rows, c) for c in range(5)}
    log.append({"rows": rows, "k": k, "top": max((len(e) - 1 for e in expected), default=0),
                "E0": [round(x, 3) for x in expected[0]] if expected else None,
                "Emean": [round(sum(e[min(c, len(e) - 1)] for e in expected) / len(expected), 3) for c in range(5)],
                "rel": {c: (round(v, 3) if v else None) for c, v in rel.items()},
                "plain_ms": (round(min(self.costs.ms[(b, 0)]), 3) if (b, 0) in self.costs.ms else None),
                "wait": self.wait})
    return k

gr.GreedyRounds.drafts = traced
model = preset_checkpoint("ouro-1.4b")
res = {}
for acc in (0.9, 0.7):
    spec = {"num_speculative_tokens": 4, "draft_loops": 2, "draft_policy": "adaptive", "synthetic_acceptance": acc}
    llm = LLM(model, dtype="bfloat16", max_num_seqs=16, cuda_graph_sizes=[1, 2, 16], speculative_config=spec)
    llm.engine.executor.worker.runner.record_device_time = True
    end_to_end(llm, 2, "warm")
    for b in (1, 16):
        log.clear()
        r = end_to_end(llm, b, f"t{b}")
        res[f"{acc}-{b}"] = {"result": {k: v for k, v in r.items()}, "trace": list(log),
                             "costs": {f"{bb}x{kk}": [round(x, 3) for x in v] for (bb, kk), v in llm.engine.scheduler.greedy_rounds.costs.ms.items()}}
        print(acc, b, r["chosen_k"], r["tok_per_s"], flush=True)
    del llm
    torch.cuda.empty_cache()
json.dump(res, open(sys.argv[1], "w"), indent=1)
