"""Session 48 call 2: what the spike's time is made of (H100/H200), and its check at few layer-loops.

    python s48_diag.py OUT.json
"""
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from persistent import Model, Runner, reference, barriers_only

res = {"device": torch.cuda.get_device_name()}
sms = torch.cuda.get_device_properties(0).multi_processor_count


def timed(fn, reps=20):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[reps // 2]


bar = torch.zeros(1, dtype=torch.int32, device="cuda")
for one in (False, True):
    def run(one=one):
        bar.zero_()
        barriers_only[(sms,)](bar, 480, ONE_THREAD=one, num_warps=4)
    ms = timed(run)
    res[f"barrier_us_one_thread_{one}"] = ms * 1e3 / 480
    print("barrier", one, ms * 1e3 / 480, flush=True)

m = Model(keys=150, maxk=256)
kc0, vc0 = m.kc.clone(), m.vc.clone()
rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
for lls in (1, 2, 4):
    for one in (False, True):
        m.kc.copy_(kc0); m.vc.copy_(vc0)
        r = Runner(m, programs=sms, ahead=0, stages=2, one_thread=one, layer_loops=lls)
        out = r.launch().clone()
        ref = reference(m, kc0.clone(), vc0.clone(), d_range=r.d_range, layer_loops=lls)
        h0 = m.h0.clone()
        m.h0 = (h0.float() * (1 + 2 ** -8 * torch.randn(h0.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(1)).sign())).to(torch.bfloat16)
        noise = rel(reference(m, kc0.clone(), vc0.clone(), d_range=r.d_range, layer_loops=lls), ref)
        m.h0 = h0
        res[f"check_ll{lls}_one_{one}"] = {"rel": rel(out, ref), "noise_rel": noise}
        print("check", lls, one, res[f"check_ll{lls}_one_{one}"], flush=True)
for one in (False, True):
    for skip in (0, 1, 2, 4, 8, 16, 31):
        r = Runner(m, programs=sms, ahead=0, stages=2, one_thread=one, skip=skip)
        ms = timed(r.launch)
        res[f"ms_one_{one}_skip_{skip}"] = ms
        print("time one", one, "skip", skip, ms, "us/ll", ms * 1e3 / 96, "regs", r.kernel.n_regs, r.kernel.n_spills, flush=True)
r = Runner(m, programs=sms, ahead=1, stages=2, one_thread=True)
res["ms_one_True_ahead1"] = timed(r.launch)
print("ahead1 one", res["ms_one_True_ahead1"])
json.dump(res, open(sys.argv[1], "w"), indent=1)
