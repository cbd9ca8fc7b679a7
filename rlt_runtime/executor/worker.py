"""Worker: one device's part of an engine — its model (or its tensor-parallel shard), KV pool and
step programs — behind a small API: load, profile memory, allocate KV, (capture graphs, set up
speculation), execute a step (swaps included).

A worker is built from `WorkerSpec`, plain data that pickles to a worker process; what crosses
in and out of `execute` is the plain `StepInput` / host arrays (the `StepHandle` carries sequence
keys, never live requests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..cache.layout import KVLayout
from ..cache.memory import MemoryPlan, block_bytes, plan_kv_cache
from ..step import StepInput
from .model_runner import ModelRunner, StepHandle


@dataclass
class WorkerSpec:
    """Everything a worker needs to build its part of the engine (plain values)."""

    model: str
    model_config: object  # ModelConfig (a frozen dataclass)
    layout: KVLayout
    seed: int
    tokenizer: Optional[str]
    revision: Optional[str]
    download_dir: Optional[str]
    device: str
    dtype: torch.dtype
    kv_dtype: torch.dtype
    quantization: Optional[str]
    attention_backend: str
    batch_invariant: bool
    execution_mode: str
    num_slots: int
    block_size: int
    max_model_len: int
    max_tokens: int
    exit_mode: str
    criterion_threshold: object
    lookahead_seed: int
    prompt_key: int
    penalties: bool = True  # the per-slot penalty state (enable_penalties)
    tp_rank: int = 0
    tp_size: int = 1


class Worker:
    def __init__(self, spec: WorkerSpec, tensor_parallel=None):
        """tensor_parallel: the rank's `TensorParallel` group when spec.tp_size > 1."""
        self.spec = spec
        self.device = torch.device(spec.device)
        self.tp = tensor_parallel
        self.model = self.ops = self.runner = None
        self.weights_bytes = 0
        self._asleep: dict = {}  # sleep mode: tag -> what `sleep` released and `wake_up` has not restored

    def load(self, weights=None) -> None:
        """Build the ops, the model (this rank's shard) and the runner. `weights`: an iterator of
        (hf_name, tensor) already opened by the caller, else the worker loads them itself."""
        from ..models import build_model, load_model
        from .ops import select_ops

        s, mc = self.spec, self.spec.model_config
        # A tensor-parallel rank loads the whole model on the CPU, keeps its shard and moves only that.
        load_device = torch.device("cpu") if self.tp is not None else self.device
        if weights is None:
            _, weights, _ = load_model(s.model, seed=s.seed, device=load_device, dtype=s.dtype, tokenizer=s.tokenizer,
                                       revision=s.revision, download_dir=s.download_dir)
        self.ops = select_ops(self.device, s.attention_backend, s.batch_invariant)
        self.model = build_model(mc, s.layout, load_device, s.dtype, s.quantization)
        self.model.load_weights(weights)
        if self.tp is not None:
            from ..models.tensor_parallel import move_model, shard_model

            shard_model(self.model, self.tp)
            move_model(self.model, self.device)
        on_cuda = self.device.type == "cuda"
        self.weights_bytes = torch.cuda.memory_allocated(self.device) if on_cuda else 0
        if s.execution_mode == "compile":
            from .opaque_ops import opaque

            self.ops = opaque(self.ops)  # torch.compile sees the kernels as opaque custom ops
        self.runner = ModelRunner(
            self.model, mc, s.layout, ops=self.ops, device=self.device, dtype=s.dtype, num_slots=s.num_slots,
            num_blocks=1, block_size=s.block_size, max_model_len=s.max_model_len, max_rows=s.num_slots,
            max_tokens=s.max_tokens, exit_mode=s.exit_mode, criterion_threshold=s.criterion_threshold,
            lookahead_seed=s.lookahead_seed, prompt_key=s.prompt_key, kv_dtype=s.kv_dtype, penalties=s.penalties,
        )

    def update_weights(self, weights: list) -> int:
        """Write `weights` ((hf_name, tensor) pairs: a whole checkpoint's or any part of it) into the
        live weights in place, this rank's shard of each (models/weight_update.py). Returns the bytes
        written on this worker."""
        from ..models.weight_update import write_weights

        written = write_weights(self.model, weights)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return written

    def sleep(self, level: int) -> int:
        """Give back the device memory of the weights (level 1: kept in host memory; level 2:
        discarded) and of the KV cache, dropping the captured graphs that read them
        (executor/sleep.py). Returns the bytes given back."""
        from ..models.tensor_parallel import weight_tensors
        from .sleep import kv_tensors, release

        self.runner.drop_graphs()
        self._asleep = {"weights": release(weight_tensors(self.model), keep=level == 1),
                        "kv_cache": release(kv_tensors(self.runner.kv), keep=False)}
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        return sum(r.nbytes for r in self._asleep.values())

    def wake_up(self, tags: list[str]) -> None:
        """Take back the memory of `tags` ("weights", "kv_cache"); once both are back, capture the
        startup graphs again."""
        from .sleep import restore

        for tag in tags:
            restore(self._asleep.pop(tag))
        if not self._asleep and self.runner.graphs is not None:
            self.runner.capture_startup_graphs()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def plan_memory(self, cfg, useful_blocks: int) -> MemoryPlan:
        """The KV pool size this device allows (profiling the largest steps on CUDA)."""
        from .profiling import profile_step_peak

        s = self.spec
        per_block = block_bytes(s.layout.num_cache_layers, s.block_size, self.model.kv_heads,
                                s.model_config.head_dim, s.kv_dtype)
        return plan_kv_cache(cfg, device=self.device, per_block=per_block, useful_blocks=useful_blocks,
                             weights_bytes=self.weights_bytes,
                             profile_peak=lambda: profile_step_peak(self, graphs=s.execution_mode != "eager"),
                             graph_reserve_bytes=0,
                             state_bytes=self.runner.logit_proc.nbytes + self.runner.token_mask.nbytes)

    def allocate_kv(self, num_blocks: int) -> None:
        self.runner.allocate_kv(num_blocks)

    def enable_graphs(self, sizes: list[int], token_sizes: list[int]) -> None:
        self.runner.enable_graphs(self.spec.execution_mode, sizes, token_sizes)

    def init_speculation(self, num_speculative_tokens: int, draft_loops: int, synthetic_acceptance,
                         graph_sizes: Optional[list[int]]) -> None:
        """Self-speculative rounds; graph_sizes: the round's row buckets (None: eager)."""
        from .speculative import SpeculativeRunner

        self.runner.spec = SpeculativeRunner(self.runner, num_speculative_tokens, draft_loops, synthetic_acceptance)
        self.runner.record_device_time = True  # rounds' device times teach the adaptive policy's round costs
        if graph_sizes is not None:
            self.runner.spec.enable_graphs(self.spec.execution_mode, graph_sizes)

    def export_swapped(self, step: StepInput) -> list:
        """Swap out step.swap_out's sequences and return their host copies (disaggregated prefill)."""
        return self.runner.export_swapped(step)

    def import_swapped(self, swap_id: int, saved: list) -> None:
        """Hold host copies from another engine under swap_id until a step swaps them in."""
        self.runner.import_swapped(swap_id, saved)

    def execute(self, step: StepInput, guide=None, late_masks=None) -> StepHandle:
        """Submit the step's device work (swaps first); the handle's result() waits for it.
        guide, late_masks: see `ModelRunner.execute`."""
        return self.runner.execute(step, guide, late_masks)

    def graph_stats(self) -> dict:
        r = self.runner
        stats = lambda g: g.stats.as_dict() if g is not None else None  # noqa: E731
        return {"graphs": stats(r.graphs), "prefill_graphs": stats(r.prefill_graphs),
                "speculative": stats(r.spec.graphs) if r.spec is not None else None}
