"""Run a conformance case with greedy rounds' draft counts drawn at random (seeded): python3 scratch/s38_random_drafts.py CASE.json RESULT.json SEED [features]"""
import random, sys
from rlt_runtime.engine import greedy_rounds
orig = greedy_rounds.GreedyRounds.drafts
rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
def drafts(self, expected, fixed_tokens, fixed_k, rows, exploring=()):
    k = orig(self, expected, fixed_tokens, fixed_k, rows, exploring)
    top = max((len(e) - 1 for e in expected), default=0)
    return rng.randint(fixed_k, max(fixed_k, top))
greedy_rounds.GreedyRounds.drafts = drafts
import json
from perf import conformance_case
case_path = sys.argv[1]
if len(sys.argv) > 4:  # features override: comma list, "-" for none
    c = json.load(open(case_path))
    c["features"] = [] if sys.argv[4] == "-" else sys.argv[4].split(",")
    case_path = sys.argv[2] + ".case.json"
    json.dump(c, open(case_path, "w"))
sys.exit(conformance_case.main([case_path, sys.argv[2]]))
