"""GPU conformance matrix: seeded random engine configurations, each case in its own process,
compared bit for bit with the same requests run alone (see perf/conformance_case.py for what one
case checks, docs/gpu_validation.md for how to run it and read the log).

    python -m perf.conformance --out DIR [--cases 40] [--seed 0] [--workers 6] [--budget-s 420]
                               [--device cuda|cpu] [--only SUBSTRING ...] [--first I]

Writes DIR/conformance.jsonl (one line per case, as it finishes), DIR/conformance.md (summary
table) and DIR/cases/ (each case's JSON, result and stderr). A case that timed out beside the others
runs once more with nothing beside it, if the budget allows (`alone`: its limit catches hangs, and
cases sharing the GPU slow each other's graph captures several-fold); the last jsonl line of a case
is its result, and a pass on that rerun says so in its detail. A case that failed beside the others
runs once more alone too and stays failed; its detail ends with the alone run's status (a failure
that passes alone depends on timing, e.g. on how steps were composed). Exit code: 0 when every case passed
or was not applicable, 1 when any failed, crashed or timed out, 2 when none failed but some did
not run within the budget.

Case i is drawn from random.Random(f"{seed}:{i}"), so it does not depend on --cases or --only
(`--only "c017 "` reruns one case, `--only "c035 " --only "c043 "` any of several; `--first 24` runs
cases 24.. of the same matrix, e.g. the ones a previous run's budget left out).
Invalid combinations are found by constructing the engine: a ConfigError on a combination listed
in EXPECTED_REJECTIONS is "not-applicable"; any other ConfigError is a failure (a feature that
silently drops out must not pass).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Per-request sampling features a case may draw (each request of the case takes each drawn feature
# with probability 1/2, so rows with and without it share batches); perf/conformance_case.py
# builds and checks them.
FEATURES = ("penalties", "bias-min-bad", "prompt-logprobs", "best-of", "guided")
LATE_FEATURES = ("allowed-ids", "thinking-budget")  # drawn after every other dimension (so the draws before them stay as they were)
COMPILE_EVERY = 20  # on CUDA, cases 5, 25, 45, ... run in compile mode (minutes of Inductor time each)
FAILING = ("fail", "crash", "timeout")
STATUSES = ("pass", "not-applicable", *FAILING, "not-run")


def _plane_sharing(case: dict) -> bool:
    return case["kv_layout"] == "shared" or case["kv_layout"].startswith("compress-s")


# (what, applies to the case, the ConfigError message must match): combinations the engine rejects
# by design. A ConfigError outside this list fails the case.
EXPECTED_REJECTIONS = [
    ("speculation with a plane-sharing layout (shared, compress-sN)",
     lambda c: bool(c["speculative_config"]) and _plane_sharing(c), r"speculative_config needs a layout with one plane per loop"),
    ("graphs/compile need CUDA", lambda c: c["device"] == "cpu" and c["execution_mode"] != "eager",
     r"needs a CUDA device"),
    ("copy reads need one plane per loop", lambda c: c["last_exited_reads"] == "copy" and c["kv_layout"] != "last_exited",
     r"needs one plane per loop"),
    ("token budget below max_num_seqs", lambda c: c["max_num_batched_tokens"] < c["max_num_seqs"],
     r"must be >= max_num_seqs"),
    ("guided decoding where xgrammar is not installed (perf/fetch_gpu_wheels.sh carries it)",
     lambda c: "guided" in c.get("features", ()), r"needs the xgrammar package"),
]

DEFAULTS = dict(
    model="ouro-tiny", dtype="float32", device="cpu", kv_layout="last_exited", last_exited_reads=None,
    exit_mode="ouro", exit_thresholds=[1.0], exit_criterion_threshold=None, lookahead_seed=0,
    speculative_config=None, sampling="greedy", logprobs=None, n=1, loop_bounds=False, prefix_caching=True,
    preemption_mode="recompute", tiny_pool=0, max_num_seqs=4, max_num_batched_tokens=32, prefill_chunk_size=None,
    execution_mode="eager", async_scheduling=False, cuda_graph_sizes=[1, 2, 4], requests=3, max_tokens=8,
    max_model_len=256, gpu_memory_utilization=0.04, workload_seed=0, plant=None, time_limit_s=None,
    features=[], quantization=None, kv_cache_dtype="auto", split_keys=None, alone=False, new_weights=False,
    sleep=False, replay_drafts=None,
)


def complete(index: int, fields: dict) -> dict:
    """A full case: DEFAULTS overridden by `fields`, plus its id and a readable name."""
    unknown = sorted(set(fields) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown case field(s) {unknown}; valid: {sorted(DEFAULTS)}")
    case = {**DEFAULTS, **fields}
    case["id"] = f"c{index:03d}"
    case["name"] = describe(case)
    return case


def describe(c: dict) -> str:
    """One line naming every dimension of a case (what --only matches)."""
    layout = c["kv_layout"] + (f"/{c['last_exited_reads']}" if c["last_exited_reads"] else "")
    exit_ = c["exit_mode"]
    if c["exit_criterion_threshold"] is not None:
        exit_ += f"@{c['exit_criterion_threshold']}"
    elif c["exit_thresholds"]:
        exit_ += "@" + ",".join(str(t) for t in c["exit_thresholds"])
    s = c["speculative_config"]
    spec = f"spec-{s['draft_policy']}{s['num_speculative_tokens']}d{s['draft_loops'] or '-'}" if s else "nospec"
    pool = f"{c['preemption_mode']}-pool+{c['tiny_pool']}" if c["tiny_pool"] else "pool"
    mode = c["execution_mode"] + ("+async" if c["async_scheduling"] else "")
    if c["execution_mode"] != "eager":
        mode += "[" + ",".join(map(str, c["cuda_graph_sizes"])) + "]"
    parts = [c["id"], c["model"], {"float32": "fp32", "bfloat16": "bf16"}.get(c["dtype"], c["dtype"]), layout, exit_,
             spec, c["sampling"], f"lp{c['logprobs']}", f"n{c['n']}", "prefix" if c["prefix_caching"] else "noprefix",
             pool, f"seqs{c['max_num_seqs']}", f"chunk{c['prefill_chunk_size']}/{c['max_num_batched_tokens']}", mode,
             f"req{c['requests']}x{c['max_tokens']}"]
    if c["features"]:
        parts.append("feat-" + "+".join(c["features"]))
    if c["quantization"] or c["kv_cache_dtype"] != "auto":
        weights = {None: "", "fp8": "w", "w8a8_fp8": "w8a8"}[c["quantization"]]
        parts.append("fp8" + weights + ("kv" if c["kv_cache_dtype"] == "fp8" else ""))
    if c["loop_bounds"]:
        parts.append("loops2-3")
    if c["split_keys"]:
        parts.append(f"split{c['split_keys']}")
    if c["new_weights"]:
        parts.append("new-weights-asleep" if c["sleep"] else "new-weights")
    if c["plant"]:
        parts.append(f"plant-{c['plant']}")
    return " ".join(parts)


def draw_case(index: int, seed: int, device: str) -> dict:
    """Case `index` of the matrix (deterministic in (seed, index, device))."""
    rng = random.Random(f"{seed}:{index}")
    f = dict(device=device, workload_seed=rng.randrange(2**31))
    f["model"] = rng.choice(["ouro-tiny", "huginn-tiny"])
    f["dtype"] = rng.choice(["float32", "bfloat16"])
    if f["model"] == "ouro-tiny":
        f["kv_layout"], f["last_exited_reads"] = rng.choice([("last_exited", "indirect"), ("last_exited", "copy"),
                                                              ("shared", None)])
        f["exit_mode"], f["exit_thresholds"] = rng.choice([("ouro", [1.0]), ("ouro", [1.0, 0.6, 0.55]),
                                                           ("ouro_delayed", [0.55, 1.0]), ("random_lookahead", [0.5])])
    else:
        f["kv_layout"] = rng.choice(["last_exited", "shared", "compress-s2", "compress-s4"])
        f["last_exited_reads"] = rng.choice(["indirect", "copy"]) if f["kv_layout"] == "last_exited" else None
        f["exit_mode"], f["exit_criterion_threshold"] = rng.choice([("fixed", None), ("kl", 1.0), ("latent-diff", 1.2)])
        f["exit_thresholds"] = []
    f["sampling"] = rng.choice(["greedy", "sampled", "mixed"])
    f["logprobs"] = rng.choice([None, 0, 2])
    f["n"] = rng.choice([1, 1, 2])
    f["loop_bounds"] = rng.random() < 0.25
    f["prefix_caching"] = rng.random() < 0.6
    f["preemption_mode"] = rng.choice(["recompute", "swap"])
    f["tiny_pool"] = rng.choice([0, 0, 2, 6])  # spare blocks beyond the largest request: preemption
    f["max_num_seqs"] = rng.choice([2, 4, 8])
    f["max_num_batched_tokens"] = max(f["max_num_seqs"], rng.choice([16, 32, 64, 128]))
    f["prefill_chunk_size"] = rng.choice([None, 3, 7, 16])
    f["requests"] = rng.randint(3, 8)
    f["max_tokens"] = rng.choice([8, 12, 16])
    f["async_scheduling"] = rng.random() < 0.5
    f["execution_mode"] = "eager" if device == "cpu" else rng.choice(["eager", "graphs", "graphs", "graphs"])
    if device == "cuda" and index % COMPILE_EVERY == COMPILE_EVERY // 4:
        f["execution_mode"] = "compile"
    ladder = rng.choice([[1, 2, 4, 8], [1, 3, 8], [2, 4]])
    f["cuda_graph_sizes"] = [s for s in ladder if s <= f["max_num_seqs"]] or [f["max_num_seqs"]]
    spec = rng.choice([None, None, "fixed", "adaptive"])
    if spec and _plane_sharing(f) and rng.random() < 0.75:
        spec = None  # rejected by design: a few cases check that it stays so
    f["speculative_config"] = None
    if spec:
        f["speculative_config"] = {"num_speculative_tokens": rng.choice([1, 2, 3]), "draft_policy": spec,
                                   "draft_loops": rng.choice([None, 1, 2])}
    if f["execution_mode"] == "compile":
        # Inductor compiles every bucket (tens of seconds each): one decode bucket, prefill buckets
        # 16 and 32, no speculation (its rounds are more programs still).
        f["cuda_graph_sizes"], f["max_num_batched_tokens"] = [min(4, f["max_num_seqs"])], 32
        f["speculative_config"] = None
    # Drawn last, so the draws above stay what they were before these dimensions existed.
    f["features"] = sorted(rng.sample(FEATURES, rng.choice([0, 1, 1, 2])))
    f["kv_cache_dtype"] = "fp8" if rng.random() < 0.25 else "auto"
    f["quantization"] = "fp8" if rng.random() < 0.15 else None
    # Attention over 64-key ranges with longer prompts: decode and prefill launches split their keys
    # (range programs, merged in place) as they do at long contexts.
    f["split_keys"] = 64 if rng.random() < 0.3 else None
    if f["quantization"] is None and rng.random() < 0.15:
        f["quantization"] = "w8a8_fp8"  # FP8 input rows too
    f["features"] += [name for name in LATE_FEATURES if rng.random() < 0.25]
    f["new_weights"] = rng.random() < 0.2  # LLM.update_weights after a warm-up run (graphs captured, prefixes cached)
    # Half of those update while asleep (sleep level 2, weights woken, updated, then the KV cache
    # woken: the graphs are captured again); not compiled engines, which have no sleep mode.
    f["sleep"] = f["new_weights"] and f["execution_mode"] != "compile" and rng.random() < 0.5
    return complete(index, f)


def crowd_case(index: int, seed: int) -> dict:
    """The large case (CUDA only): ouro-1.4b in bf16, ~60 mixed-length requests, graphs + async."""
    rng = random.Random(f"{seed}:crowd")
    return complete(index, dict(
        model="ouro-1.4b", dtype="bfloat16", device="cuda", kv_layout="last_exited", last_exited_reads="indirect",
        exit_mode="ouro", exit_thresholds=[1.0, 0.6], sampling="mixed", logprobs=2, n=1, prefix_caching=True,
        max_num_seqs=64, max_num_batched_tokens=512, execution_mode="graphs", async_scheduling=True,
        cuda_graph_sizes=[8, 16, 32, 64], requests=60, max_tokens=8, gpu_memory_utilization=0.12,
        workload_seed=rng.randrange(2**31), features=["bias-min-bad", "penalties", "allowed-ids", "thinking-budget"],
    ))


def matrix(num_cases: int, seed: int, device: str) -> list[dict]:
    """The first num_cases cases: on CUDA the ouro-1.4b crowd first, then random cases."""
    first = [crowd_case(0, seed)] if device == "cuda" and num_cases else []
    return first + [draw_case(i, seed, device) for i in range(len(first), num_cases)]


def time_limit(case: dict) -> float:
    """Seconds one case may take (startup, graph capture or compilation, the crowd, the references).
    H200, 8 cases at a time beside the GPU test suite: passing cases took up to 147 s (270 s for
    ouro-1.4b, 247 s in compile mode); the limits leave room for that load."""
    if case["time_limit_s"] is not None:
        return float(case["time_limit_s"])
    if case["execution_mode"] == "compile" or case["model"] == "ouro-1.4b":
        return 420.0
    return 240.0


def classify(case: dict, result: dict) -> dict:
    """Map a child's config-error to not-applicable (expected by design) or fail (anything else)."""
    if result["status"] != "config-error":
        return result
    for what, applies, pattern in EXPECTED_REJECTIONS:
        if applies(case) and re.search(pattern, result["detail"]):
            return {**result, "status": "not-applicable", "detail": f"{what}: {result['detail']}"}
    return {**result, "status": "fail", "detail": f"unexpected ConfigError: {result['detail']}"}


def _tail(path: Path, chars: int = 2000) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    return text[-chars:]


def run_one(case: dict, out: Path, deadline: float) -> dict:
    """Run one case in a child process under its time limit (cut to the budget's deadline)."""
    left = deadline - time.monotonic()
    row = {"id": case["id"], "name": case["name"], "case": case}
    if left <= 1:
        return {**row, "status": "not-run", "detail": "time budget spent before the case started", "duration_s": 0.0}
    cases = out / "cases"
    case_path, result_path, err_path = (cases / f"{case['id']}{ext}" for ext in (".json", ".result.json", ".stderr"))
    if case.get("alone") and err_path.exists():  # a rerun alone keeps the run beside others' log and result
        err_path.replace(cases / f"{case['id']}.beside.stderr")
        if result_path.exists():
            result_path.replace(cases / f"{case['id']}.beside.result.json")
    case_path.write_text(json.dumps(case), encoding="utf-8")
    result_path.unlink(missing_ok=True)
    limit = min(time_limit(case), left)
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", PYTHONUNBUFFERED="1")
    if case["device"] == "cpu":
        env["TRITON_INTERPRET"] = "1"
    start = time.monotonic()
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "perf.conformance_case", str(case_path), str(result_path)],
                                cwd=REPO, env=env, stdout=err, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and anything it started
            proc.wait()
            rc = None
    row.update(duration_s=round(time.monotonic() - start, 2), exit_code=rc)
    if rc is None:
        budget_cut = limit < time_limit(case)
        return {**row, "status": "not-run" if budget_cut else "timeout", "stderr_tail": _tail(err_path),
                "detail": f"killed after {limit:.0f} s" + (" (the budget ran out)" if budget_cut else "")}
    if rc != 0 or not result_path.exists():
        sig = f" (signal {-rc})" if rc < 0 else ""
        return {**row, "status": "crash", "detail": f"exit code {rc}{sig}", "stderr_tail": _tail(err_path)}
    result = classify(case, json.loads(result_path.read_text(encoding="utf-8")))
    return {**row, **result, "duration_s": row["duration_s"]}


def summary_markdown(rows: list[dict], wall_s: float) -> str:
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    lines = [f"# Conformance: {len(rows)} cases in {wall_s:.0f} s",
             "", " · ".join(f"{s}: {n}" for s, n in counts.items() if n), "",
             "| case | status | s | first mismatch / reason | stats |", "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["id"]):
        detail = (r.get("detail") or "").replace("|", "\\|").replace("\n", " ")
        st = r.get("stats") or {}
        stats = ", ".join(f"{k} {v}" for k, v in st.items() if k in ("preemptions", "prefix_cache_hits", "spec_rounds") and v)
        lines.append(f"| {r['name']} | {r['status']} | {r.get('duration_s', 0):.0f} | {detail[:300]} | {stats} |")
    return "\n".join(lines) + "\n"


def exit_code(rows: list[dict]) -> int:
    if any(r["status"] in FAILING for r in rows):
        return 1
    return 2 if any(r["status"] == "not-run" for r in rows) else 0


def rerun_alone(row: dict, run) -> dict:
    """Run a case that timed out beside others once more, one at a time (the pool has finished).
    A pass keeps the first timeout in its detail; a second timeout stays a timeout."""
    again = run({**row["case"], "alone": True})
    if again["status"] == "not-run":  # no budget left for it: the first result stands
        return row
    detail = f"timed out after {row['duration_s']:.0f} s beside other cases; alone: {again['status']} in " \
             f"{again['duration_s']:.0f} s" + (f" ({again['detail']})" if again.get("detail") else "")
    return {**again, "detail": detail, "stderr_tail_beside_others": row.get("stderr_tail", "")}


def rerun_failure_alone(row: dict, run) -> dict:
    """Run a case that failed beside others once more, one at a time, with the draft counts its
    greedy rounds took there (`round_drafts`, the one choice that follows timings). It stays a
    failure (a case's bits must not depend on what else shares the device); its detail says whether
    it fails alone too: a failure alone is deterministic, reproducible from the case and its
    `round_drafts`; a pass alone points at the device's timing (a race), not at the composition."""
    replay = row.get("round_drafts")
    again = run({**row["case"], "alone": True, "replay_drafts": replay})
    if again["status"] == "not-run":
        return row
    same = ", same draft counts" if replay else ""
    return {**row, "alone_status": again["status"], "alone_detail": again.get("detail", ""),
            "detail": f"{row['detail']}; alone{same}: {again['status']} in {again['duration_s']:.0f} s"}


# What a status beside others gets run alone with.
RERUNS = {"timeout": rerun_alone, "fail": rerun_failure_alone}


def run_matrix(cases: list[dict], out: Path, workers: int, budget_s: float) -> int:
    """Run the cases on `workers` parallel processes within budget_s; write the log and the table.
    Slow cases start first so the budget cuts the cheap ones, if any."""
    out = Path(out)
    (out / "cases").mkdir(parents=True, exist_ok=True)
    log_path = out / "conformance.jsonl"
    log_path.write_text("", encoding="utf-8")
    start = time.monotonic()
    deadline = start + budget_s

    def run(case):
        try:
            return run_one(case, out, deadline)
        except Exception as exc:  # the harness itself broke on this case: record it, keep the others
            return {"id": case["id"], "name": case["name"], "case": case, "status": "crash", "duration_s": 0.0,
                    "detail": f"harness error: {exc!r}"}

    def record(row):
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps(row) + "\n")
        print(f"{row['status']:>14}  {row['duration_s']:6.1f} s  {row['name']}"
              + (f"\n{'':>26}{row['detail']}" if row["status"] not in ("pass", "not-run") else ""), flush=True)
        return row

    order = sorted(cases, key=time_limit, reverse=True)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(lambda case: record(run(case)), order))
    if workers > 1 and len(cases) > 1:
        rows = [record(RERUNS[row["status"]](row, run)) if row["status"] in RERUNS else row for row in rows]
    wall = time.monotonic() - start
    (out / "conformance.md").write_text(summary_markdown(rows, wall), encoding="utf-8")
    code = exit_code(rows)
    print(f"conformance: {len(rows)} cases in {wall:.0f} s, exit code {code}; see {out / 'conformance.md'}")
    return code


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for conformance.jsonl, conformance.md and cases/")
    ap.add_argument("--cases", type=int, default=40, help="number of cases (on CUDA the first is the ouro-1.4b crowd)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=6, help="cases run side by side (each engine takes a small GPU share)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget of the whole matrix")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    ap.add_argument("--only", action="append", default=None,
                    help="run only cases whose name contains this substring (repeat: any of them)")
    ap.add_argument("--first", type=int, default=0, help="skip the cases before this index")
    args = ap.parse_args(argv)
    if args.cases < 1 or args.workers < 1 or args.budget_s <= 0 or not 0 <= args.first < args.cases:
        ap.error("--cases and --workers must be >= 1, --budget-s > 0 and --first in 0..cases-1")
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = [c for c in matrix(args.cases, args.seed, device)[args.first:]
             if args.only is None or any(part in c["name"] for part in args.only)]
    if not cases:
        ap.error(f"no case from index {args.first} on has a name containing any of {args.only!r}")
    return run_matrix(cases, Path(args.out), args.workers, args.budget_s)


if __name__ == "__main__":
    sys.exit(main())
