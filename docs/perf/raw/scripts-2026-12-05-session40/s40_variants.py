"""Session 40: c021 variants, one field changed at a time, each in its own process; RLT_PDL per variant.
    python3 scratch/s40_variants.py OUTDIR"""
import json, os, subprocess, sys, time
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
base = json.load(open("scratch/c021.json"))
tape = json.load(open("scratch/c038_tape.json"))
variants = [("c038-tape", "1", tape), ("c038-tape-torch-attn", "1", dict(tape, attn="torch")),
            ("base-pdl1", "1", {}), ("base-pdl0", "0", {}), ("eager", "0", {"execution_mode": "eager"}),
            ("sync", "0", {"async_scheduling": False}), ("nosplit", "0", {"split_keys": None}),
            ("nospec", "0", {"speculative_config": None}), ("c021-torch-attn-pdl0", "0", {"attn": "torch"}),
            ("indirect", "0", {"last_exited_reads": "indirect"}), ("nofeat", "0", {"features": []}),
            ("c038-tape-pdl0", "0", tape), ("base-pdl0-again", "0", {})]
for name, pdl, change in variants:
    case = dict(base, **change)
    attn = case.pop("attn", "")
    path = f"{out}/{name}.json"
    json.dump(case, open(path, "w"))
    t0 = time.time()
    with open(f"{out}/{name}.log", "w") as log:
        subprocess.run([sys.executable, "scratch/s40_case_dump.py", path, f"{out}/{name}.result.json"],
                       env=dict(os.environ, RLT_PDL=pdl, S40_ATTN=attn), stdout=log, stderr=subprocess.STDOUT, timeout=120)
    try:
        r = json.load(open(f"{out}/{name}.result.json"))
        print(f"{name:18s} pdl{pdl} {r['status']:5s} {time.time() - t0:5.1f} s {r['detail'][:260]}", flush=True)
    except Exception as exc:  # noqa: BLE001
        print(name, "no result", exc, flush=True)
    if os.environ.get("OUT"):  # what has run so far comes back even if the call is cut
        subprocess.run(["tar", "czf", os.environ["OUT"] + "/variants.tgz", "-C", os.path.dirname(out) or ".", os.path.basename(out)])
