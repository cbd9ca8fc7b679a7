"""c002 (seed 0) many times at once beside GPU load, in variants; one line per finished run.
    python3 scratch/s47_c002_stress.py OUTDIR SECONDS"""
import json, os, subprocess, sys, time, itertools
sys.path.insert(0, ".")
from perf.conformance import draw_case
out, seconds = sys.argv[1], float(sys.argv[2])
os.makedirs(out, exist_ok=True)
base = draw_case(2, 0, "cuda")
print(base["name"], flush=True)
variants = [("base", "1", {}), ("base", "1", {}), ("base", "1", {}), ("pdl0", "0", {}), ("pdl0", "0", {}),
            ("sync", "1", {"async_scheduling": False}), ("sync", "1", {"async_scheduling": False}),
            ("eager-async", "1", {"execution_mode": "eager"})]
end = time.time() + seconds
loads = [subprocess.Popen([sys.executable, "scratch/s40_load.py", str(i), str(seconds)]) for i in range(2)]
counter = itertools.count()
running = {}
tally = {}
def start(slot):
    name, pdl, change = variants[slot]
    i = next(counter)
    case = dict(base, **change)
    path = f"{out}/{i:03d}-{name}.json"
    json.dump(case, open(path, "w"))
    log = open(f"{out}/{i:03d}-{name}.stderr", "w")
    p = subprocess.Popen([sys.executable, "-m", "perf.conformance_case", path, f"{out}/{i:03d}-{name}.result.json"],
                         env=dict(os.environ, RLT_PDL=pdl), stdout=log, stderr=subprocess.STDOUT)
    running[slot] = (p, i, name, time.time())
for slot in range(len(variants)):
    start(slot)
while running:
    time.sleep(0.5)
    for slot, (p, i, name, t0) in list(running.items()):
        if p.poll() is None:
            if time.time() > end + 60:
                p.kill()
            continue
        del running[slot]
        try:
            r = json.load(open(f"{out}/{i:03d}-{name}.result.json"))
            status, detail = r["status"], r["detail"][:300]
        except Exception as exc:  # noqa: BLE001
            status, detail = f"crash rc={p.returncode}", str(exc)[:100]
        tally.setdefault(name, {}).setdefault(status, 0)
        tally[name][status] += 1
        print(f"{i:03d} {name:12s} {status:5s} {time.time() - t0:5.1f} s {detail}", flush=True)
        if time.time() + 45 < end:
            start(slot)
print("TALLY", json.dumps(tally), flush=True)
for l in loads:
    l.kill()
