"""c038 on CPU through the Triton interpreter with random draft counts: python interp_case.py CASE OUT SEED"""
import json, random, sys
from rlt_runtime.engine import greedy_rounds
import perf.conformance_case as cc
orig = greedy_rounds.GreedyRounds.drafts
rng = random.Random(int(sys.argv[3]))
def drafts(self, expected, fixed_tokens, fixed_k, rows, exploring=()):
    k = orig(self, expected, fixed_tokens, fixed_k, rows, exploring)
    top = max((len(e) - 1 for e in expected), default=0)
    return rng.randint(fixed_k, max(fixed_k, top))
greedy_rounds.GreedyRounds.drafts = drafts
for name in ("engine_options", "alone_options"):
    f = getattr(cc, name)
    setattr(cc, name, lambda *a, _f=f, **kw: dict(_f(*a, **kw), attention_backend="triton"))
case = json.load(open(sys.argv[1]))
res = cc.run_case(case)
json.dump(res, open(sys.argv[2], "w"), default=str)
print(res["status"], res["detail"][:300], res.get("stats"))
