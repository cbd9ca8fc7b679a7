"""c018's crowd run 4 times in one engine, and once in a sync eager engine: do runs agree with each other?"""
import json, sys
from perf.conformance_case import build_workload, engine_options, run_crowd, first_difference
from rlt_runtime import LLM
from rlt_runtime.models.presets import preset_config
case = json.load(open(sys.argv[1]))
work = build_workload(case, preset_config(case["model"]).vocab_size)
opts = engine_options(case, "cuda")
llm = LLM(case["model"], **opts)
runs = [run_crowd(llm, work)[0] for _ in range(4)]
del llm
eager = LLM(case["model"], **dict(opts, execution_mode="eager", async_scheduling=False))
runs.append(run_crowd(eager, work)[0])
for i in range(1, 5):
    for rid in runs[0]:
        d = first_difference(runs[i][rid], runs[0][rid])
        print(f"run{i} vs run0 {rid}: {d or 'same'}", flush=True)
