"""Bucketed CUDA graphs of the decode program (all loops, exit, LM head, sampling).

Row counts are padded up to a bucket ladder; padded rows are inert every step (the kernels read
the device-side live-row count, padded rows sample nothing and write no K/V). Graphs are captured
at startup, largest bucket first, into one shared memory pool, with automatic garbage collection
paused during capture (a collected old graph must not be destroyed mid-capture). A failed capture
drains the stream and the bucket falls back to eager execution; every fallback is counted.

Two backends capture the same Python program: manual `torch.cuda.CUDAGraph` capture
(``execution_mode="graphs"``) and `torch.compile(mode="reduce-overhead")` with static shapes per
bucket (``execution_mode="compile"``), whose CUDA-graph trees record once per bucket because every
persistent tensor (KV cache, tables, slot state, step inputs) is marked as a static address.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

logger = logging.getLogger("rlt")

MAX_GRAPH_ROWS = 512


def default_ladder(max_rows: int) -> list[int]:
    """1, 2, 4, 8, then every 8 to 64, every 16 to 256, every 32 beyond (capped at max_rows)."""
    sizes = [1, 2, 4]
    sizes += list(range(8, 65, 8)) + list(range(80, 257, 16)) + list(range(288, MAX_GRAPH_ROWS + 1, 32))
    ladder = [s for s in sizes if s < max_rows] + [max_rows]
    return sorted(set(ladder))


def doubling_ladder(limit: int, first: int = 1) -> list[int]:
    """Powers of two from `first` below `limit`, then `limit` itself (prefill token buckets from
    16; speculative-round row buckets from 1)."""
    sizes, s = [], first
    while s < limit:
        sizes.append(s)
        s *= 2
    return sizes + [limit]


def persistent_tensors(*roots, depth: int = 4) -> list:
    """Every tensor the roots hold, through attributes, lists, tuples and dicts up to `depth`
    levels (weights, FP8 weights' data and scales, KV caches, slot state, staging buffers and their views): what a compiled
    program reads in place and must not copy into its graph inputs each replay."""
    found: dict[int, torch.Tensor] = {}

    def visit(x, level):
        if isinstance(x, torch.Tensor):
            found.setdefault(id(x), x)
        elif level > 0 and isinstance(x, (list, tuple)):
            for y in x:
                visit(y, level - 1)
        elif level > 0 and isinstance(x, dict):
            for y in x.values():
                visit(y, level - 1)
        elif level > 0 and hasattr(x, "__dict__") and not isinstance(x, type) and not callable(x):
            for y in vars(x).values():
                visit(y, level - 1)

    for root in roots:
        visit(root, depth)
    return list(found.values())


def run_bucketed(graphs: Optional[DecodeGraphs], program: Callable[..., dict], rows: int, variant: tuple,
                 eager: bool = False, **eager_args) -> dict:
    """Run a step program for `rows` live rows: the replay of its bucket's graph, else eagerly (no
    graphs; `eager`: inputs a capture cannot take, passed as eager_args; or a counted fallback),
    padded to the bucket when one exists. Results keep the program's (bucket) rows."""
    res = graphs.run(rows, variant) if graphs is not None and not eager else None
    if res is None:
        size = (graphs.bucket(rows) if graphs is not None else None) or rows
        res = program(size, *variant, **eager_args)
    return res


@dataclass
class GraphStats:
    captures: int = 0
    replays: int = 0
    fallbacks: int = 0
    failed_captures: int = 0
    real_rows: int = 0
    padded_rows: int = 0
    capture_seconds: float = 0.0
    compile_seconds: float = 0.0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        total = self.real_rows + self.padded_rows
        d["padding_waste"] = self.padded_rows / total if total else 0.0
        return d


@dataclass
class DecodeGraphs:
    """Captured step programs keyed by (bucket rows, variant).

    `program(rows, *variant)` must read every per-step input from static tensors; a variant is a
    tuple of Python values that change the program's shape or work (e.g. logprobs top-N, the
    number of speculative drafts).
    """

    program: Callable[..., dict]
    inert_inputs: list  # device tensors zeroed during warm-up/capture (live-row counts), restored after
    sizes: list[int]
    mode: str = "graphs"
    static_tensors: list = field(default_factory=list)
    stats: GraphStats = field(default_factory=GraphStats)

    def __post_init__(self):
        self.sizes = sorted(set(self.sizes))
        self._entries: dict[tuple, Callable[[], dict]] = {}  # (bucket, variant) -> replay
        self._failed: set = set()
        self._pool = torch.cuda.graph_pool_handle() if self.mode == "graphs" else None
        if self.mode == "compile":
            for t in self.static_tensors:
                torch._dynamo.mark_static_address(t)
            self._compiled = torch.compile(self.program, mode="reduce-overhead", fullgraph=False, dynamic=False)

    def bucket(self, rows: int) -> Optional[int]:
        for s in self.sizes:
            if s >= rows:
                return s
        return None

    def drop(self) -> None:
        """Forget every captured program, so its memory can go back (sleep mode: the tensors it read
        move); the next run of a bucket captures it again."""
        self._entries.clear()
        self._failed.clear()
        if self.mode == "graphs":
            self._pool = torch.cuda.graph_pool_handle()

    def capture_all(self, variant: tuple) -> None:
        """Capture every bucket for one variant not captured yet, largest first (startup)."""
        for size in reversed(self.sizes):
            if (size, variant) not in self._entries:
                self._capture(size, variant)

    def run(self, rows: int, variant: tuple) -> Optional[dict]:
        """Replay the bucket for `rows` live rows; None means the caller must run eagerly (counted)."""
        size = self.bucket(rows)
        key = (size, variant)
        if size is None or key in self._failed:
            self.stats.fallbacks += 1
            return None
        replay = self._entries.get(key) or self._capture(*key)
        if replay is None:
            self.stats.fallbacks += 1
            return None
        outputs = replay()
        self.stats.replays += 1
        self.stats.real_rows += rows
        self.stats.padded_rows += size - rows
        return outputs

    def _capture(self, size: int, variant: tuple) -> Optional[Callable[[], dict]]:
        gc_enabled = gc.isenabled()
        gc.disable()
        start = time.perf_counter()
        stream = torch.cuda.Stream()
        saved = [t.clone() for t in self.inert_inputs]  # a lazy capture happens mid-step: keep its inputs
        try:
            for t in self.inert_inputs:
                t.zero_()
            stream.wait_stream(torch.cuda.current_stream())
            if self.mode == "compile":
                replay = self._compile_entry(size, variant, stream)
            else:
                with torch.cuda.stream(stream):
                    self.program(size, *variant)  # warm-up: Triton compiles outside the capture
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool, stream=stream):
                    outputs = self.program(size, *variant)
                replay = lambda g=graph, o=outputs: (g.replay(), o)[1]  # noqa: E731
            torch.cuda.current_stream().wait_stream(stream)
        except Exception as exc:  # capture failure: drain, count, fall back to eager for this bucket
            stream.synchronize()
            torch.cuda.synchronize()
            self._failed.add((size, variant))
            self.stats.failed_captures += 1
            logger.warning("CUDA graph capture of bucket %d failed (%s); it will run eagerly", size, exc)
            return None
        finally:
            for t, v in zip(self.inert_inputs, saved):
                t.copy_(v)
            if gc_enabled:
                gc.enable()
        elapsed = time.perf_counter() - start
        if self.mode == "compile":
            self.stats.compile_seconds += elapsed
            logger.info("compiled bucket %d %s in %.1f s", size, variant, elapsed)
        else:
            self.stats.capture_seconds += elapsed
        self.stats.captures += 1
        self._entries[(size, variant)] = replay
        return replay

    def _compile_entry(self, size: int, variant: tuple, stream) -> Callable[[], dict]:
        compiled = self._compiled
        with torch.cuda.stream(stream):
            for _ in range(3):  # compile, then let cudagraph trees warm up and record
                compiled(size, *variant)
        stream.synchronize()

        def replay() -> dict:
            # A CUDA-graph tree hands out its outputs in pool memory that the next compiled call
            # (any bucket, any program: a step's prefill then its decode) overwrites; the step's
            # results outlive that call (device→host copies, async steps), so they are copied out.
            return {name: t.clone() for name, t in compiled(size, *variant).items()}

        return replay
