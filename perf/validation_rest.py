"""What an earlier GPU validation left unfinished: the GPU tests with no result in its pytest log and
the conformance cases that did not run within its budget.

    python -m perf.validation_rest PREVIOUS_WORK --tests    one pytest node id a line
    python -m perf.validation_rest PREVIOUS_WORK --cases    one `--only` argument a line ("c031 ")

PREVIOUS_WORK is an earlier `perf/run_gpu.sh validate` call's $WORK (gpu_tests.log from `pytest -v`
and conformance/conformance.jsonl), carried to the device. A test counts as finished when the log
gives it a result (PASSED, FAILED, SKIPPED, ERROR, XFAIL, XPASS); the GPU tests are collected again
here (`pytest --collect-only -m gpu`), so tests added since are included. A case counts as finished
unless its last line says "not-run"; failures are findings to rerun alone by hand, not rest.
`perf/run_gpu.sh rest` (REST_FROM=PREVIOUS_WORK) runs both.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

_OUTCOME = "(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)"
_XDIST_RESULT = re.compile(rf"^\[gw\d+\] \[ *\d+%\] {_OUTCOME} (tests/.*?)\s*$")  # outcome, then the id
_PLAIN_RESULT = re.compile(rf"^(tests/.*?) {_OUTCOME}(\s|$)")  # the id, then the outcome


def finished_tests(log: str) -> set[str]:
    """Node ids (which may hold spaces) that `pytest -v`, with or without xdist, gave a result in ``log``."""
    done = set()
    for line in log.splitlines():
        if m := _XDIST_RESULT.match(line):
            done.add(m.group(2))
        elif m := _PLAIN_RESULT.match(line):
            done.add(m.group(1))
    return done


def gpu_tests() -> list[str]:
    """Node ids of every GPU test, as pytest collects them from this checkout."""
    out = subprocess.run([sys.executable, "-m", "pytest", "tests", "-m", "gpu", "--collect-only", "-q",
                          "-p", "no:cacheprovider"], capture_output=True, text=True, check=False).stdout
    return [line.strip() for line in out.splitlines() if "::" in line]


def unfinished_tests(log: str, collected: list[str]) -> list[str]:
    done = finished_tests(log)
    return [t for t in collected if t not in done]


def unrun_cases(jsonl: str) -> list[str]:
    """Case ids whose last line in a conformance.jsonl is "not-run", in the matrix's order."""
    last = {}
    for line in jsonl.splitlines():
        if line.strip():
            row = json.loads(line)
            last[row["id"]] = row["status"]
    return sorted(case for case, status in last.items() if status == "not-run")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work", type=Path, help="an earlier validate call's $WORK")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--tests", action="store_true")
    what.add_argument("--cases", action="store_true")
    args = ap.parse_args(argv)
    if args.tests:
        log = args.work / "gpu_tests.log"
        rest = unfinished_tests(log.read_text() if log.exists() else "", gpu_tests())
    else:
        jsonl = args.work / "conformance" / "conformance.jsonl"
        rest = [f"{case} " for case in unrun_cases(jsonl.read_text() if jsonl.exists() else "")]
    for line in rest:
        print(line)


if __name__ == "__main__":
    main()
