"""Command line and result files shared by the end-to-end benchmark scripts."""

from __future__ import annotations

import argparse
import json
import os
from typing import Callable, Optional


def bench_main(stem: str, run: Callable[[str, bool], dict], markdown: Callable[[dict], str],
               plot: Optional[Callable[[dict, str], None]] = None) -> None:
    """Parse --out/--quick, run, write <stem>.json, <stem>.md (and <stem>.png), print the table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=f"out/{stem}")
    ap.add_argument("--quick", action="store_true", help="fewer batches and configurations")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    res = run(args.out, args.quick)
    with open(os.path.join(args.out, f"{stem}.json"), "w") as f:
        json.dump(res, f, indent=2, default=str)
    md = markdown(res)
    with open(os.path.join(args.out, f"{stem}.md"), "w") as f:
        f.write(md)
    if plot is not None:
        plot(res, os.path.join(args.out, f"{stem}.png"))
    print(md)
