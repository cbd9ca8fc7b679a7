"""Prometheus metrics of one server, with vLLM's names where vLLM has the metric.

Every server owns a `CollectorRegistry`, so several servers in one process do not clash.
Request timings are observed by the engine owner thread as outputs come out of `step()`.
Engine-wide values (running/waiting requests, KV usage, prefix-cache and speculative counters)
come from `engine.stats()` snapshots the owner thread takes at most every `stats_interval`
seconds, and are exported at scrape time.

`engine.stats()["speculative"]` (present with speculative decoding) is read as a dict of
cumulative counts: `rounds`, `drafted`, `accepted`, and the lists `accepted_per_position` /
`drafted_per_position` (index = draft position). Missing keys are simply not exported.

With data parallelism the engine-wide values are the front end's aggregate (counters summed over
replicas, gauges over live ones) and `stats()["data_parallel"]["replicas"]` adds one labelled
series per replica: up (1/0), running and waiting requests, KV usage.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from ...outputs import RequestOutput

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.25, 0.5, 0.75, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
FINISH_REASONS = ("stop", "length", "abort", "error")
# (exported name, key of engine.stats()["speculative"], help)
SPEC_COUNTERS = (("vllm:spec_decode_num_drafts", "rounds", "Speculative rounds"),
                 ("vllm:spec_decode_num_draft_tokens", "drafted", "Drafted tokens"),
                 ("vllm:spec_decode_num_accepted_tokens", "accepted", "Accepted draft tokens"))
SPEC_PER_POSITION = (("vllm:spec_decode_num_accepted_tokens_per_pos", "accepted_per_position",
                      "Accepted draft tokens by draft position"),
                     ("rlt:spec_decode_num_drafted_tokens_per_pos", "drafted_per_position",
                      "Drafted tokens by draft position"))
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class RequestTimer:
    """Per engine request progress kept by the owner thread (monotonic seconds)."""

    arrival: float
    first_token: Optional[float] = None
    last_token: Optional[float] = None


class ServerMetrics:
    """Collectors of one server. Thread-safe: the owner thread writes, scrapes read."""

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time from request arrival to its first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Time between successive steps that gave a request new tokens", buckets=ITL_BUCKETS,
                             registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Time from request arrival to its end",
                             buckets=E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens", registry=r)
        self.request_finished = Counter("vllm:request_success", "Finished sequences by finish reason",
                                        ["finished_reason"], registry=r)
        for reason in FINISH_REASONS:
            self.request_finished.labels(reason)
        self._lock = threading.Lock()
        self._loop_counts: dict[int, int] = {}
        self._depth = 1
        self._stats: dict = {}
        r.register(self)  # collect() exports the engine snapshot

    # ---- owner thread ----------------------------------------------------------------------------
    def set_depth(self, depth: int) -> None:
        """The model depth: buckets of rlt:loops_per_token are 1..depth."""
        self._depth = depth

    def admitted(self, num_prompt_tokens: int) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)

    def observe(self, timer: RequestTimer, out: RequestOutput, now: float) -> None:
        """Account the tokens of a delta output (`step(deltas=True)`: what each sample added since
        the request's previous output) and the request's end."""
        new = sum(len(c.token_ids) for c in out.outputs)
        if new:
            self.generation_tokens.inc(new)
            if timer.first_token is None:
                timer.first_token = now
                self.ttft.observe(now - timer.arrival)
            else:
                self.itl.observe(now - timer.last_token)
            timer.last_token = now
            with self._lock:
                for c in out.outputs:
                    for d in c.exit_depths:
                        self._loop_counts[d] = self._loop_counts.get(d, 0) + 1
        if out.finished:
            if any(c.finish_reason != "abort" for c in out.outputs):
                self.e2e.observe(now - timer.arrival)
            for c in out.outputs:
                if c.finish_reason in FINISH_REASONS:
                    self.request_finished.labels(c.finish_reason).inc()

    def update_engine(self, stats: dict) -> None:
        """Replace the engine snapshot exported at scrape time."""
        self._stats = dict(stats)

    # ---- scrape ----------------------------------------------------------------------------------
    def render(self) -> bytes:
        return generate_latest(self.registry)

    def loop_histogram(self) -> tuple[list[tuple[str, float]], float]:
        with self._lock:
            counts = dict(self._loop_counts)
        top = max([self._depth, *counts]) if counts else self._depth
        buckets, running = [], 0
        for d in range(1, top + 1):
            running += counts.get(d, 0)
            buckets.append((str(float(d)), running))
        buckets.append(("+Inf", running))
        return buckets, float(sum(d * c for d, c in counts.items()))

    def collect(self):
        """Engine snapshot and loops-per-token histogram (called by the registry at scrape time)."""
        s = self._stats
        yield GaugeMetricFamily("vllm:num_requests_running", "Requests in the running batch", value=s.get("running", 0))
        yield GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting for admission", value=s.get("waiting", 0))
        yield GaugeMetricFamily("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full)",
                                value=s.get("kv_usage", 0.0))
        yield CounterMetricFamily("vllm:prefix_cache_queries", "Prefix-cache block lookups",
                                  value=s.get("prefix_cache_queries", 0))
        yield CounterMetricFamily("vllm:prefix_cache_hits", "Prefix-cache block hits",
                                  value=s.get("prefix_cache_hits", 0))
        yield CounterMetricFamily("vllm:num_preemptions", "Preempted requests", value=s.get("preemptions", 0))
        spec = s.get("speculative")
        if isinstance(spec, dict):
            for name, key, help_text in SPEC_COUNTERS:
                if key in spec:
                    yield CounterMetricFamily(name, help_text, value=spec[key])
            for name, key, help_text in SPEC_PER_POSITION:
                if spec.get(key) is not None:
                    fam = CounterMetricFamily(name, help_text, labels=["position"])
                    for pos, count in enumerate(spec[key]):
                        fam.add_metric([str(pos)], count)
                    yield fam
        dp = s.get("data_parallel")
        if isinstance(dp, dict):
            yield from _replica_metrics(dp)
        buckets, total = self.loop_histogram()
        yield HistogramMetricFamily("rlt:loops_per_token", "Loops run by each generated token (its exit depth)",
                                    buckets=buckets, sum_value=total)


def _replica_metrics(dp: dict):
    """Per-replica series of a data-parallel engine (label `replica` = its index)."""
    series = (("rlt:replica_up", "1 while the data-parallel replica serves, 0 once it failed", None),
              ("rlt:replica_num_requests_running", "Requests in the replica's running batch", "running"),
              ("rlt:replica_num_requests_waiting", "Requests waiting for admission on the replica", "waiting"),
              ("rlt:replica_kv_cache_usage_perc", "Fraction of the replica's KV blocks in use", "kv_usage"))
    for name, help_text, key in series:
        fam = GaugeMetricFamily(name, help_text, labels=["replica"])
        for r in dp["replicas"]:
            value = float(r["alive"]) if key is None else (r["stats"].get(key, 0) if r["alive"] else 0)
            fam.add_metric([str(r["index"])], value)
        yield fam
