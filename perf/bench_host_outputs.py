"""Host cost of the output path per engine step, against how long requests have run (CPU).

    python -m perf.bench_host_outputs --out out/host_outputs [--quick]

The engine runs `ouro-tiny` with its device work replaced by a stand-in that "samples" a fixed
multi-byte text (so no model time is measured): 256 streams decode together from output length 0
to 2,000, and every step's host CPU time (the thread's CPU time, so that other processes on a
shared machine do not inflate it) (scheduling, result processing, detokenization, stop
matching, building the outputs) plus the streaming consumer's time (what the server's worker
and SSE formatter do with each output) is recorded. Three request kinds: plain, with stop
strings (never matched, so text is watched token by token), with logprobs (top 2).

Modes: `cumulative` (engine.step(): every touched request's whole output each step, consumed the
way a cumulative stream is: new text by slicing the whole text) and `delta` (engine.step(deltas=
True): only what is new, merged in place by `OutputAccumulator`, the server's path).
"""

from __future__ import annotations

import inspect
import time

import torch

from perf.report import bench_main

TEXT = "Loops run — naïve café, 東京 ＆ ünïcödé 🙂 then plain ASCII words again. "
STREAMS = 256
LENGTHS = (100, 250, 500, 1000, 2000)
WINDOW = 20  # steps averaged around each length


def _fake_execute(engine, ids: list[int]):
    """executor.execute replacement: every sampling row commits the next id of the text, depth D
    (the engine's requests of the step are read from its step builder)."""
    from rlt_runtime.executor.model_runner import StepHandle

    build, built = engine._steps.build, {}

    def recording_build(sched):
        step, built["live"] = build(sched)
        return step, built["live"]

    engine._steps.build = recording_build

    def execute(step, guide=None):
        h = StepHandle()
        h.rows = [(s.key, s.generation, "decode", 0) for s in step.decodes]
        h.rows += [(c.request.key, c.request.generation, "prefill", 0) for c in step.prefills if c.sample]
        h.prefills = [(c.request.key, c.request.generation, len(c.token_ids)) for c in step.prefills]
        if not h.rows:
            return h
        reqs = [built["live"][key] for key, *_ in h.rows]
        toks = [ids[(r.arrival_index + len(r.output_token_ids) + r.inflight_outputs) % len(ids)] for r in reqs]
        n = len(toks)
        h.host = {"tokens": torch.tensor(toks, dtype=torch.int64)[:, None],
                  "depths": torch.full((n, 1), engine.depth, dtype=torch.int32)}
        if any(r.wants_logprobs for r in reqs):
            h.host["logprobs"] = torch.full((n, 1), -0.5)
            h.host["top_ids"] = torch.tensor(toks, dtype=torch.int64)[:, None, None].repeat(1, 1, 2)
            h.host["top_logprobs"] = torch.full((n, 1, 2), -0.5)
        return h

    return execute


class _CumulativeConsumer:
    """What a stream of cumulative outputs costs a consumer: new text by slicing the whole text."""

    def __init__(self):
        self.sent: dict[tuple, list] = {}

    def take(self, out) -> int:
        new = 0
        for c in out.outputs:
            st = self.sent.setdefault((out.request_id, c.index), ["", 0])
            text = c.text[len(st[0]):] if c.text.startswith(st[0]) else ""
            tokens, depths = c.token_ids[st[1]:], c.exit_depths[st[1]:]
            st[0], st[1] = st[0] + text, len(c.token_ids)
            new += len(tokens) + 0 * len(depths)
        return new


class _DeltaConsumer:
    """The server's path: merge each delta in place, take the new text by piece cursor."""

    def __init__(self):
        from rlt_runtime.outputs import OutputAccumulator

        self._new = OutputAccumulator
        self.acc: dict[str, object] = {}
        self.cursor: dict[tuple, int] = {}

    def take(self, out) -> int:
        acc = self.acc.get(out.request_id)
        if acc is None:
            acc = self.acc[out.request_id] = self._new()
        acc.add(out)
        new = 0
        for c in out.outputs:
            key = (out.request_id, c.index)
            _, self.cursor[key] = acc.text_since(c.index, self.cursor.get(key, 0))
            new += len(c.token_ids)
        return new


def _measure(kind: str, mode: str, quick: bool) -> dict:
    from rlt_runtime import SamplingParams
    from rlt_runtime.engine.llm_engine import LLMEngine

    max_len = LENGTHS[1] if quick else LENGTHS[-1]
    engine = LLMEngine("ouro-tiny", device="cpu", dtype="float32", kv_layout="shared", max_num_seqs=STREAMS,
                       max_num_batched_tokens=4096, num_blocks=STREAMS * (-(-(max_len + 40) // 16)) + 64)
    ids = [int(t) for t in engine.tokenizer.encode(TEXT, add_special_tokens=False)]
    engine.executor.execute = _fake_execute(engine, ids)
    extra = {"stop": {"stop": ["\x00never one", "no such stop"]}, "logprobs": {"logprobs": 2}}.get(kind, {})
    params = SamplingParams(max_tokens=max_len, ignore_eos=True, temperature=0, **extra)
    for i in range(STREAMS):
        engine.add_request(f"r{i}", ids[i % 7: i % 7 + 12], params)
    deltas = "deltas" in inspect.signature(engine.step).parameters
    if mode == "delta" and not deltas:
        return {}
    consumer = _DeltaConsumer() if mode == "delta" else _CumulativeConsumer()
    kwargs = {"deltas": True} if mode == "delta" else {}
    per_step = []  # (output length after the step, engine host ms, consumer ms)
    while engine.has_unfinished_requests():
        t0 = time.thread_time()
        outs = engine.step(**kwargs)
        t1 = time.thread_time()
        for out in outs:
            consumer.take(out)
        t2 = time.thread_time()
        length = max((len(r.output_token_ids) for r in engine.scheduler.running), default=max_len)
        per_step.append((length, (t1 - t0) * 1e3, (t2 - t1) * 1e3))
    points = {}
    for target in LENGTHS:
        if target > max_len:
            continue
        window = [s for s in per_step if target - WINDOW < s[0] <= target]
        if window:
            points[target] = {"engine_ms": sum(s[1] for s in window) / len(window),
                              "consumer_ms": sum(s[2] for s in window) / len(window)}
    return points


def run(out: str, quick: bool) -> dict:
    """RLT_HOST_BENCH_MODES (default "cumulative,delta") picks the modes measured."""
    import os
    import platform

    res = {"machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
           "streams": STREAMS, "points": {}}
    for kind in ("plain", "stop", "logprobs"):
        for mode in os.environ.get("RLT_HOST_BENCH_MODES", "cumulative,delta").split(","):
            res["points"][f"{kind}/{mode}"] = _measure(kind, mode, quick)
    return res


def markdown(res: dict) -> str:
    lengths = sorted({int(n) for pts in res["points"].values() for n in pts})
    lines = [f"Host CPU ms per step, {res['streams']} streams ({res['machine']}): engine + streaming consumer", "",
             "| requests / outputs | " + " | ".join(f"at {n} tokens" for n in lengths) + " |",
             "|---|" + "---|" * len(lengths)]
    for name, pts in res["points"].items():
        if not pts:
            continue
        cells = []
        for n in lengths:
            p = pts.get(n, pts.get(str(n)))
            cells.append("" if p is None else f"{p['engine_ms']:.2f} + {p['consumer_ms']:.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    bench_main("host_outputs", run, markdown)
