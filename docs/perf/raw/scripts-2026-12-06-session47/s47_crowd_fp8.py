"""The ouro-1.4b crowd case (c000, seed 0) with FP8 K/V (MHA: the one-warp FP8 decode kernel), with and
without W8A8, in parallel; each its own process.   python3 scratch/s47_crowd_fp8.py OUTDIR"""
import json, os, subprocess, sys, time
sys.path.insert(0, ".")
from perf.conformance import crowd_case, complete
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
base = {k: v for k, v in crowd_case(0, 0).items() if k not in ("id", "name")}
variants = {"c000-fp8kv": dict(base, kv_cache_dtype="fp8"),
            "c000-w8a8-fp8kv": dict(base, kv_cache_dtype="fp8", quantization="w8a8_fp8")}
procs = {}
for name, fields in variants.items():
    case = complete(0, fields)
    json.dump(case, open(f"{out}/{name}.json", "w"))
    procs[name] = (subprocess.Popen([sys.executable, "-m", "perf.conformance_case", f"{out}/{name}.json",
                                     f"{out}/{name}.result.json"], stdout=open(f"{out}/{name}.stderr", "w"),
                                    stderr=subprocess.STDOUT), time.time())
    print(case["name"], flush=True)
for name, (p, t0) in procs.items():
    p.wait()
    try:
        r = json.load(open(f"{out}/{name}.result.json"))
        print(name, r["status"], f"{time.time() - t0:.0f} s", r["detail"][:400], r["checks"], r["stats"], flush=True)
    except Exception as exc:  # noqa: BLE001
        print(name, "no result", p.returncode, exc, open(f"{out}/{name}.stderr").read()[-1500:], flush=True)
