"""Run one conformance case (perf.conformance_case) and also dump every request's crowd and alone samples.
    python3 scratch/s40_case_dump.py CASE.json RESULT.json"""
import json, sys
import perf.conformance_case as cc
pairs = []
_first = cc.first_difference
def recording(got, want):
    pairs.append({"got": got, "want": want})
    return _first(got, want)
cc.first_difference = recording
import os
attn = os.environ.get("S40_ATTN")
if attn:  # every engine of the case with this attention backend
    for name in ("engine_options", "alone_options"):
        f = getattr(cc, name)
        setattr(cc, name, lambda *a, _f=f, **kw: dict(_f(*a, **kw), attention_backend=attn))
case = json.load(open(sys.argv[1]))
res = cc.run_case(case)
res["pairs"] = pairs
json.dump(res, open(sys.argv[2], "w"), default=str)
