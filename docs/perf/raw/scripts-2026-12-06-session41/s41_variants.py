"""Session 41: c038 (draft tape, idle GPU) and c021/c038 variants under background load, each in its own
process.  python3 scratch/s41_variants.py OUTDIR BUDGET_S"""
import json, os, subprocess, sys, time
out, budget = sys.argv[1], float(sys.argv[2])
os.makedirs(out, exist_ok=True)
T0 = time.time()
c021 = json.load(open("scratch/c021.json"))
c038 = json.load(open("scratch/c038.json"))
tape = json.load(open("scratch/c038_tape.json"))
# (name, RLT_PDL, base, change, under load); names starting "old-" run the tree without the fix
# (/tmp/old: this tree with s41_verify_unfused.patch reverted)
variants = [
    ("old-c021-load-pdl0", "0", c021, {}, True), ("c021-load-pdl0", "0", c021, {}, True),
    ("c038-load", "1", c038, {}, True), ("old-c038-load", "1", c038, {}, True),
    ("c021-load-pdl1", "1", c021, {}, True), ("c038-load-pdl0", "0", c038, {}, True),
    ("c021-load-pdl0-2", "0", c021, {}, True), ("c038-tape", "1", tape, {}, False),
]
load = []
for name, pdl, base, change, loaded in variants:
    if time.time() - T0 > budget - 30:
        print(name, "not run (budget)", flush=True)
        continue
    if not loaded and load:
        for p in load:
            p.kill()
        load = []
    if loaded and not load:
        load = [subprocess.Popen([sys.executable, "scratch/s40_load.py", str(s), "900"]) for s in (1, 2, 3)]
    case = dict(base, **change)
    attn = case.pop("attn", "")
    ref = case.pop("ref", "")
    path = f"{out}/{name}.json"
    json.dump(case, open(path, "w"))
    t0 = time.time()
    with open(f"{out}/{name}.log", "w") as log:
        try:
            subprocess.run([sys.executable, "scratch/s41_case_dump.py", path, f"{out}/{name}.result.json"],
                           cwd="/tmp/old" if name.startswith("old-") else None,
                           env=dict(os.environ, RLT_PDL=pdl, S40_ATTN=attn, S41_REF=ref), stdout=log, stderr=subprocess.STDOUT,
                           timeout=max(10, min(120, budget - (time.time() - T0))))
        except subprocess.TimeoutExpired:
            print(name, "timeout", flush=True)
    try:
        r = json.load(open(f"{out}/{name}.result.json"))
        print(f"{name:22s} pdl{pdl} {'load' if loaded else 'idle'} {r['status']:5s} {time.time() - t0:5.1f} s {r['detail'][:400]}", flush=True)
    except Exception as exc:  # noqa: BLE001
        print(name, "no result", exc, flush=True)
    if os.environ.get("OUT"):
        subprocess.run(["tar", "czf", os.environ["OUT"] + "/variants.tgz", "-C", os.path.dirname(out) or ".", os.path.basename(out)])
for p in load:
    p.kill()
