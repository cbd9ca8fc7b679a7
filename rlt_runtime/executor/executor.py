"""The engine's one way to its workers: `Executor`.

The engine (scheduler, front ends) sees only these calls, whether one worker runs in its own
process (`UniprocExecutor`) or a tensor-parallel group runs one worker process per rank
(`executor/multiproc.py`). Every call takes and returns plain data; `execute` returns a handle
whose `rows`, `prefills` and `prompt_rows` name sequences by the step's keys, and whose
`result()` waits for the step's host arrays.
"""

from __future__ import annotations

from typing import Optional

from ..cache.memory import MemoryPlan
from ..step import StepInput
from .worker import Worker, WorkerSpec


class Executor:
    """Interface (see module docstring); each call applies to every worker."""

    def plan_memory(self, cfg, useful_blocks: int) -> MemoryPlan:
        raise NotImplementedError

    def allocate_kv(self, num_blocks: int) -> None:
        raise NotImplementedError

    def enable_graphs(self, sizes: list[int], token_sizes: list[int]) -> None:
        raise NotImplementedError

    def init_speculation(self, num_speculative_tokens: int, draft_loops: int, synthetic_acceptance,
                         graph_sizes: Optional[list[int]]) -> None:
        raise NotImplementedError

    def execute(self, step: StepInput, guide=None, late_masks=None):
        """guide(drafted) -> masks, given exactly when `step.guided_drafting()` is not empty: called
        once, between the round's drafting and its verification, with {step key: drafted tokens
        y_1..y_k} of those rows; returns {step key: int32 [k + 1, ceil(vocab / 32)] CPU bitmask},
        row j the tokens allowed after drafts y_1..y_j.
        late_masks() -> (slots, int32 [len(slots), ceil(vocab / 32)] CPU bitmasks), given for a
        plain decode step whose guided rows' masks depend on the step before: called once, before
        the step samples (as late as the executor can: after its forward is submitted)."""
        raise NotImplementedError

    def graph_stats(self) -> dict:
        raise NotImplementedError

    def update_weights(self, weights: list) -> None:
        """Every worker writes `weights` ((hf_name, tensor) pairs: a checkpoint's, whole or in part) into its own."""
        raise NotImplementedError

    def sleep(self, level: int) -> int:
        """Every worker gives back its weights' (level 1: kept on the host; 2: discarded) and KV
        cache's device memory; returns the bytes given back by all."""
        raise NotImplementedError

    def wake_up(self, tags: list[str]) -> None:
        """Every worker takes back the memory of `tags` ("weights", "kv_cache")."""
        raise NotImplementedError

    def worker_processes(self) -> list[dict]:
        """The worker processes: [{"rank", "pid", "device"}], empty when the worker runs in the engine's process."""
        return []

    def export_swapped(self, step: StepInput) -> list:
        """Swap out step.swap_out's sequences and return their K/V host copies (one worker only)."""
        raise NotImplementedError

    def import_swapped(self, swap_id: int, saved: list) -> None:
        """Hold K/V host copies from another engine for a later swap-in (one worker only)."""
        raise NotImplementedError

    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers (wait: give each its time to exit before it is terminated; no-op in process)."""


class UniprocExecutor(Executor):
    """One worker in the engine's process; `worker` is reachable for tests and tools."""

    def __init__(self, spec: WorkerSpec, weights=None):
        self.worker = Worker(spec)
        self.worker.load(weights)

    def plan_memory(self, cfg, useful_blocks: int) -> MemoryPlan:
        return self.worker.plan_memory(cfg, useful_blocks)

    def allocate_kv(self, num_blocks: int) -> None:
        self.worker.allocate_kv(num_blocks)

    def enable_graphs(self, sizes: list[int], token_sizes: list[int]) -> None:
        self.worker.enable_graphs(sizes, token_sizes)

    def init_speculation(self, num_speculative_tokens: int, draft_loops: int, synthetic_acceptance,
                         graph_sizes: Optional[list[int]]) -> None:
        self.worker.init_speculation(num_speculative_tokens, draft_loops, synthetic_acceptance, graph_sizes)

    def execute(self, step: StepInput, guide=None, late_masks=None):
        return self.worker.execute(step, guide, late_masks)

    def graph_stats(self) -> dict:
        return self.worker.graph_stats()

    def update_weights(self, weights: list) -> None:
        self.worker.update_weights(weights)

    def sleep(self, level: int) -> int:
        return self.worker.sleep(level)

    def wake_up(self, tags: list[str]) -> None:
        self.worker.wake_up(tags)

    def export_swapped(self, step: StepInput) -> list:
        return self.worker.export_swapped(step)

    def import_swapped(self, swap_id: int, saved: list) -> None:
        self.worker.import_swapped(swap_id, saved)


def build_executor(spec: WorkerSpec, cfg, weights=None) -> Executor:
    """The executor for the engine options: in process, or one worker process per
    tensor-parallel rank (`weights`, already opened by the engine, serve the in-process worker)."""
    if cfg.tensor_parallel_size == 1:
        return UniprocExecutor(spec, weights)
    from .multiproc import MultiprocExecutor

    return MultiprocExecutor(spec, cfg.tensor_parallel_size, step_timeout_s=cfg.step_timeout_s)
