"""The one dispatch of every step program (decode, prefill, speculative round): a graph replay of
the bucket, else the program run eagerly at the bucket's rows. The replay side needs CUDA, so a
stand-in with the graphs' `bucket` / `run` interface records what is asked of it."""

from __future__ import annotations

from rlt_runtime.executor.graphs import run_bucketed


class Graphs:
    """Buckets 4 and 8; `run` replays unless the bucket is marked failed (then: a fallback)."""

    def __init__(self, failed=()):
        self.failed, self.runs = set(failed), []

    def bucket(self, rows):
        return next((s for s in (4, 8) if s >= rows), None)

    def run(self, rows, variant):
        self.runs.append((rows, variant))
        size = self.bucket(rows)
        return None if size is None or size in self.failed else {"replayed": (size, variant)}


def program(rows, *variant, **extra):
    return {"eager": (rows, variant, extra)}


def test_without_graphs_the_program_runs_at_the_live_rows():
    assert run_bucketed(None, program, 3, (True, 2)) == {"eager": (3, (True, 2), {})}


def test_a_captured_bucket_replays():
    graphs = Graphs()
    assert run_bucketed(graphs, program, 3, (True, 2), prompt_rows=0) == {"replayed": (4, (True, 2))}
    assert graphs.runs == [(3, (True, 2))]


def test_a_fallback_runs_eagerly_padded_to_its_bucket():
    graphs = Graphs(failed={8})
    assert run_bucketed(graphs, program, 5, (False, 0)) == {"eager": (8, (False, 0), {})}
    assert run_bucketed(graphs, program, 9, (False, 0)) == {"eager": (9, (False, 0), {})}  # past every bucket


def test_eager_inputs_skip_the_graphs_and_reach_the_program():
    graphs = Graphs()
    got = run_bucketed(graphs, program, 3, (True, 2), eager=True, prompt_rows=7, prompt_top=1)
    assert got == {"eager": (4, (True, 2), {"prompt_rows": 7, "prompt_top": 1})} and graphs.runs == []
