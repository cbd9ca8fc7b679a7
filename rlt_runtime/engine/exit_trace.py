"""Exit traces: the host side of exit_mode="trace" (the device rules are in models/exit_rules.py)."""

from __future__ import annotations

import json

from ..errors import ConfigError


def load_trace(trace) -> dict[str, list[int]]:
    """An exit trace: {request_id: [prefill depth, decode depths...]} from a dict or a JSON file."""
    if isinstance(trace, str):
        try:
            with open(trace, encoding="utf-8") as f:
                trace = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"exit_trace: cannot read {trace!r}: {exc}") from exc
    if isinstance(trace, dict) and "depths_by_request" in trace:
        trace = trace["depths_by_request"]
    if not isinstance(trace, dict) or not all(
        isinstance(v, list) and all(isinstance(d, int) and d >= 1 for d in v) for v in trace.values()
    ):
        raise ConfigError("exit_trace must map request ids to lists of positive integer depths")
    return {str(k): list(v) for k, v in trace.items()}
