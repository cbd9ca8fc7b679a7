"""Session 41: run one conformance case (perf.conformance_case), also dumping every request's crowd and
alone samples.  python3 scratch/s41_case_dump.py CASE.json RESULT.json
S40_ATTN: attention backend of every engine; S41_REF: comma-separated op names (or "all") that run their
torch references instead of the Triton kernels on the GPU, in every engine of the case."""
import json, os, sys
import perf.conformance_case as cc
import rlt_runtime.executor.ops as ops_mod
pairs = []
_first = cc.first_difference
def recording(got, want, where=None):
    pairs.append({"got": got, "want": want})
    return _first(got, want, where)
cc.first_difference = recording
attn = os.environ.get("S40_ATTN")
if attn:  # every engine of the case with this attention backend
    for name in ("engine_options", "alone_options"):
        f = getattr(cc, name)
        setattr(cc, name, lambda *a, _f=f, **kw: dict(_f(*a, **kw), attention_backend=attn))
ref = [n for n in os.environ.get("S41_REF", "").split(",") if n]
if ref:
    names = ops_mod.OP_NAMES if ref == ["all"] else ref
    _triton = ops_mod._triton_ops
    def mixed():
        ops = _triton()
        refs = ops_mod._reference_ops()
        ops.update({n: refs[n] for n in names})
        return ops
    ops_mod._triton_ops = mixed
    print("reference ops:", names, flush=True)
class LenientTape:
    """cc.DraftTape, but a round the replay cannot give (past its end, or a count the round does not
    allow) takes the engine's own choice; `used` counts the rounds taken from the replay."""
    def __init__(self, greedy, replay=None):
        self.rounds, self.used = [], 0
        chosen = greedy.drafts
        def drafts(expected, fixed_tokens, fixed_k, rows, exploring=()):
            k = chosen(expected, fixed_tokens, fixed_k, rows, exploring)
            lo, hi = fixed_k, max(fixed_k, max((len(e) - 1 for e in expected), default=0))
            i = len(self.rounds)
            if replay is not None and i < len(replay) and lo <= replay[i][0] <= hi:
                k = replay[i][0]
                self.used += 1
            elif replay is not None:
                print(f"round {i}: not from the replay ({replay[i] if i < len(replay) else None}, allowed {lo}..{hi})", flush=True)
            self.rounds.append([k, lo, hi])
            return k
        greedy.drafts = drafts
cc.DraftTape = LenientTape
case = json.load(open(sys.argv[1]))
res = cc.run_case(case)
res["pairs"] = pairs
json.dump(res, open(sys.argv[2], "w"), default=str)
