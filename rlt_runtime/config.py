"""EngineConfig: every engine option, validated once with errors naming the field and its range.

Options keep vLLM's names where vLLM has the concept. `LLM(model, **engine_options)`, the CLI and
the server all build one of these.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .errors import ConfigError
from .vllm_options import VLLM_OPTIONS, translate_vllm_options

OURO_EXIT_MODES = ("ouro", "ouro_delayed", "random_lookahead", "trace")
HUGINN_EXIT_MODES = ("fixed", "kl", "entropy-diff", "latent-diff", "cosine", "argmax-stability", "trace")
HUGINN_CRITERION_DEFAULTS = {"kl": 5e-4, "entropy-diff": 1e-3, "latent-diff": 0.03, "cosine": 1e-3, "argmax-stability": 5}
ATTENTION_BACKENDS = ("auto", "triton", "flash", "torch")
EXECUTION_MODES = ("eager", "graphs", "compile")
SCHEDULING_POLICIES = ("fcfs", "priority")
PREEMPTION_MODES = ("recompute", "swap")
DRAFT_POLICIES = ("adaptive", "fixed")
QUANTIZATIONS = (None, "fp8", "w8a8_fp8")
KV_CACHE_DTYPES = ("auto", "fp8")
DISTRIBUTED_EXECUTORS = ("mp", "ray")  # mp: replica processes on this host; ray: Ray actors on a cluster
_COMPRESS = re.compile(r"^compress-s(\d+)$")


def _fail(name: str, allowed: str, value) -> ConfigError:
    return ConfigError(f"{name} must be {allowed}, got {value!r}")


def _int(value, name: str, lo: int, hi: Optional[int] = None, allow_none: bool = False):
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        rng = f"an integer >= {lo}" if hi is None else f"an integer in {lo}..{hi}"
        raise _fail(name, rng + (" or None" if allow_none else ""), value)


def parse_address(value, name: str) -> tuple[str, int]:
    """(host, port) of a "HOST:PORT" option (ConfigError naming the option otherwise)."""
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _fail(name, "'HOST:PORT' with a port in 1..65535", value)
    return host, int(port)


def _choice(value, name: str, choices) -> None:
    if value not in choices:
        raise _fail(name, "one of " + ", ".join(repr(c) for c in choices), value)


@dataclass
class SpeculativeConfig:
    """Self-speculative decoding: draft with the first `draft_loops` loops, verify at full depth."""

    num_speculative_tokens: int = 4
    draft_loops: Optional[int] = None  # default: 2 for Ouro, depth // 4 for Huginn
    draft_policy: str = "adaptive"
    synthetic_acceptance: Optional[float] = None  # benchmark aid only: accept each draft with this probability
    # Greedy rows draft none while more requests than this are in the engine, running or waiting (a
    # large batch's step is no longer bound by the weights, so drafts cost what they save); sampled
    # rows keep their counts.
    disable_by_batch_size: Optional[int] = 64

    def validate(self, depth: int) -> None:
        _int(self.num_speculative_tokens, "speculative_config.num_speculative_tokens", 1, 16)
        _int(self.draft_loops, "speculative_config.draft_loops", 1, depth - 1, allow_none=True)
        _int(self.disable_by_batch_size, "speculative_config.disable_by_batch_size", 1, allow_none=True)
        _choice(self.draft_policy, "speculative_config.draft_policy", DRAFT_POLICIES)
        if self.synthetic_acceptance is not None and not 0.0 <= float(self.synthetic_acceptance) <= 1.0:
            raise _fail("speculative_config.synthetic_acceptance", "None or a number in [0, 1]", self.synthetic_acceptance)


def step_time_limit(seconds: Optional[float]) -> Optional[float]:
    """`EngineConfig.step_timeout_s` as a wait limit in seconds: None (no limit) for None or inf."""
    return None if seconds is None or seconds == float("inf") else float(seconds)


@dataclass
class EngineConfig:
    """All engine options. Defaults are the fastest correct choice for the device."""

    # Model and device.
    dtype: str = "auto"
    quantization: Optional[str] = None  # "fp8": the layers' linear weights stored as FP8 e4m3, per-channel scales;
    # "w8a8_fp8": the same weights, and the layers' input rows as FP8 too (one power-of-two scale per row)
    tokenizer: Optional[str] = None  # a tokenizer directory (tokenizer.json) or Hub name other than the model's
    revision: Optional[str] = None  # the Hub revision (branch, tag or commit) of a model given by Hub name
    download_dir: Optional[str] = None  # the Hugging Face cache to read and download into (default: HF_HUB_CACHE)
    device: str = "auto"
    seed: int = 0
    data_parallel_size: int = 1  # engine replicas, one process each (tensor_parallel_size GPUs each on CUDA)
    distributed_executor: str = "mp"  # where replicas run: "mp" (local processes) or "ray" (Ray actors)
    disaggregated_prefill: bool = False  # a prefill engine process and a decode engine process (docs/distributed.md)
    tensor_parallel_size: int = 1  # ranks one model is split over, one worker process each (one GPU each on CUDA)
    prefill_tensor_parallel_size: Optional[int] = None  # disaggregated prefill: the prefill engine's ranks (None: same)
    prefill_address: Optional[str] = None  # disaggregated prefill: HOST:PORT of a prefill engine started apart
    decode_address: Optional[str] = None  # disaggregated prefill: HOST:PORT of a decode engine started apart
    role: Optional[str] = None  # "prefill" / "decode": serve that engine to a front end (rlt-serve --role)
    role_address: Optional[str] = None  # with role: HOST:PORT to listen on for the front end
    kv_transfer_address: Optional[str] = None  # with role: HOST:PORT where the two roles' K/V transfer group meets
    step_timeout_s: Optional[float] = 300.0  # a rank or replica process silent this long mid-step is failed; None: wait
    num_loops: Optional[int] = None  # depth override (Huginn recurrences; Ouro loops)
    max_model_len: Optional[int] = None
    # Scheduling.
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    enable_chunked_prefill: bool = True
    prefill_chunk_size: Optional[int] = None  # per-request chunk ceiling
    max_consecutive_prefill_steps: int = 4  # prefill-only steps before a decode step (unchunked mode)
    scheduling_policy: str = "fcfs"
    admission_scan_limit: int = 64
    max_admission_bypasses: int = 8
    enable_preemption: bool = True
    preemption_mode: str = "recompute"
    # KV cache.
    block_size: int = 16
    kv_cache_dtype: str = "auto"  # "auto": the model dtype; "fp8": FP8 e4m3 with per-(layer, KV head) scales
    kv_layout: str = "last_exited"
    last_exited_reads: Optional[str] = None  # "indirect" (key-depth table) | "copy" (finalize copies); auto
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    num_blocks: Optional[int] = None
    kv_cache_memory_bytes: Optional[int] = None
    watermark: float = 0.01
    # Loops and exit.
    exit_mode: Optional[str] = None  # default: "ouro" (Ouro) / "fixed" (Huginn)
    exit_trace: Optional[Union[str, dict]] = None
    record_exit_trace: Optional[str] = None
    lookahead_seed: int = 0
    exit_criterion_threshold: Optional[float] = None
    # Execution.
    attention_backend: str = "auto"
    execution_mode: Optional[str] = None  # default: graphs on CUDA, eager on CPU
    async_scheduling: Optional[bool] = None  # default: on with CUDA
    batch_invariant: bool = True
    cuda_graph_sizes: Optional[list[int]] = None
    speculative_config: Optional[Union[dict, SpeculativeConfig]] = None
    # Stop strings: per request, bounded so that building their automaton stays cheap.
    max_stop_strings: int = 128
    max_stop_chars: int = 4096  # total characters of a request's stop strings
    # Penalties: the per-slot output-token counts and prompt-token mask ([max_num_seqs, vocab] each)
    # that repetition/presence/frequency penalties read; off: not allocated, such requests refused.
    enable_penalties: bool = True
    # Default sampling parameters (models/generation_defaults.py): "auto" the model's generation_config.json,
    # "vllm" none, or a directory holding one.
    generation_config: str = "auto"
    # Sleep mode (`LLM.sleep` / `wake_up`, the server's /sleep and /wake_up): off, those calls are refused.
    enable_sleep_mode: bool = False
    # Profiling.
    profile_dir: Optional[str] = None
    profile_steps: tuple = (2, 4)  # (first step to record, number of steps; 0: none, only start_profile/stop_profile)

    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_kwargs(cls, **kwargs) -> "EngineConfig":
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        unknown = sorted(set(kwargs) - names - set(VLLM_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown engine option(s) {unknown}; valid options: {sorted(names)} "
                              f"(and the vLLM names {list(VLLM_OPTIONS)})")
        kwargs = translate_vllm_options(kwargs)
        cfg = cls(**kwargs)
        if isinstance(cfg.speculative_config, dict):
            try:
                cfg.speculative_config = SpeculativeConfig(**cfg.speculative_config)
            except TypeError as exc:
                raise ConfigError(f"speculative_config: {exc}") from exc
        return cfg

    def _validate_roles(self) -> None:
        """Disaggregated prefill with engines started apart: a front end names both engines'
        addresses; an engine serving a role names where it listens and where the K/V transfer group
        meets."""
        for name in ("prefill_address", "decode_address", "role_address", "kv_transfer_address"):
            if getattr(self, name) is not None:
                parse_address(getattr(self, name), name)
        if (self.prefill_address is None) != (self.decode_address is None):
            raise ConfigError("prefill_address and decode_address name the two engines a front end uses; set both "
                              "or neither")
        if self.prefill_address is not None and not self.disaggregated_prefill:
            raise ConfigError("prefill_address and decode_address are for disaggregated_prefill=True; set it or "
                              "leave them None")
        if self.prefill_address is not None and self.prefill_tensor_parallel_size is not None:
            raise ConfigError("prefill_tensor_parallel_size sizes a prefill engine this front end starts; an engine "
                              "started apart (prefill_address) takes its own tensor_parallel_size: leave it None")
        if self.role is None:
            if self.role_address is not None or self.kv_transfer_address is not None:
                raise ConfigError("role_address and kv_transfer_address are for an engine serving a role "
                                  "(role='prefill' or 'decode'); set role or leave them None")
            return
        _choice(self.role, "role", ("prefill", "decode"))
        if self.role_address is None or self.kv_transfer_address is None:
            raise ConfigError(f"role={self.role!r} needs role_address (HOST:PORT to listen on for the front end) and "
                              "kv_transfer_address (HOST:PORT on the prefill engine's host where the two engines' "
                              "K/V transfer group meets)")
        if self.disaggregated_prefill or self.data_parallel_size != 1 or self.distributed_executor != "mp":
            raise ConfigError(f"role={self.role!r} serves one engine of disaggregated prefill to a front end; it "
                              "cannot be combined with disaggregated_prefill, data_parallel_size > 1 or "
                              "distributed_executor='ray'")

    def validate_static(self) -> None:
        """Checks that need no model or device."""
        _choice(self.dtype, "dtype", ("auto", "float32", "float16", "bfloat16", "float64"))
        _choice(self.quantization, "quantization", QUANTIZATIONS)
        _choice(self.kv_cache_dtype, "kv_cache_dtype", KV_CACHE_DTYPES)
        if self.kv_cache_dtype == "fp8" and self.attention_backend == "flash":
            raise ConfigError("kv_cache_dtype='fp8' needs attention_backend 'auto', 'triton' or 'torch' (the flash "
                              "adapter reads K/V in the model dtype)")
        if self.tokenizer is not None and (not isinstance(self.tokenizer, str) or not self.tokenizer):
            raise _fail("tokenizer", "None or a tokenizer directory (holding tokenizer.json) or Hugging Face Hub name", self.tokenizer)
        for name in ("revision", "download_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise _fail(name, "None or a non-empty string", value)
        if not isinstance(self.device, str) or not re.match(r"^(auto|cpu|cuda(:\d+)?)$", self.device):
            raise _fail("device", "'auto', 'cpu', 'cuda' or 'cuda:N'", self.device)
        _int(self.seed, "seed", 0)
        _int(self.data_parallel_size, "data_parallel_size", 1)
        _choice(self.distributed_executor, "distributed_executor", DISTRIBUTED_EXECUTORS)
        if not isinstance(self.disaggregated_prefill, bool):
            raise _fail("disaggregated_prefill", "a boolean", self.disaggregated_prefill)
        if self.disaggregated_prefill and self.data_parallel_size != 1:
            raise ConfigError(f"disaggregated_prefill=True runs one prefill and one decode engine; it cannot be combined "
                              f"with data_parallel_size={self.data_parallel_size} (use data_parallel_size=1)")
        if self.disaggregated_prefill and self.distributed_executor != "mp":
            raise ConfigError(f"disaggregated_prefill=True starts its two engine processes on this host; it cannot be "
                              f"combined with distributed_executor={self.distributed_executor!r} (use 'mp')")
        _int(self.tensor_parallel_size, "tensor_parallel_size", 1)
        _int(self.prefill_tensor_parallel_size, "prefill_tensor_parallel_size", 1, allow_none=True)
        if self.prefill_tensor_parallel_size is not None and not self.disaggregated_prefill:
            raise ConfigError(f"prefill_tensor_parallel_size={self.prefill_tensor_parallel_size} sizes the prefill engine "
                              "of disaggregated prefill; set disaggregated_prefill=True or leave it None")
        self._validate_roles()
        if self.step_timeout_s is not None and (isinstance(self.step_timeout_s, bool)
                                                or not isinstance(self.step_timeout_s, (int, float))
                                                or not self.step_timeout_s > 0):
            raise _fail("step_timeout_s", "None or a number of seconds > 0", self.step_timeout_s)
        _int(self.num_loops, "num_loops", 1, 128, allow_none=True)
        _int(self.max_model_len, "max_model_len", 1, allow_none=True)
        _int(self.max_num_seqs, "max_num_seqs", 1, 4096, allow_none=True)
        _int(self.max_num_batched_tokens, "max_num_batched_tokens", 1, allow_none=True)
        _int(self.prefill_chunk_size, "prefill_chunk_size", 1, allow_none=True)
        _int(self.max_consecutive_prefill_steps, "max_consecutive_prefill_steps", 1)
        _choice(self.scheduling_policy, "scheduling_policy", SCHEDULING_POLICIES)
        _int(self.admission_scan_limit, "admission_scan_limit", 1)
        _int(self.max_admission_bypasses, "max_admission_bypasses", 0)
        _choice(self.preemption_mode, "preemption_mode", PREEMPTION_MODES)
        _choice(self.block_size, "block_size", (16, 32, 64, 128, 256))
        if not isinstance(self.gpu_memory_utilization, (int, float)) or not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise _fail("gpu_memory_utilization", "a number in (0, 1]", self.gpu_memory_utilization)
        if self.num_blocks is not None and self.kv_cache_memory_bytes is not None:
            raise ConfigError("num_blocks and kv_cache_memory_bytes are mutually exclusive; set at most one")
        _int(self.num_blocks, "num_blocks", 1, allow_none=True)
        _int(self.kv_cache_memory_bytes, "kv_cache_memory_bytes", 1, allow_none=True)
        if not isinstance(self.watermark, (int, float)) or not 0.0 <= self.watermark < 1.0:
            raise _fail("watermark", "a number in [0, 1)", self.watermark)
        _choice(self.attention_backend, "attention_backend", ATTENTION_BACKENDS)
        if self.last_exited_reads is not None:
            _choice(self.last_exited_reads, "last_exited_reads", ("indirect", "copy"))
            if self.attention_backend == "flash" and self.last_exited_reads == "indirect":
                raise ConfigError("attention_backend='flash' cannot read planes through the key-depth table; "
                                  "use last_exited_reads='copy' (the default with flash)")
        if self.execution_mode is not None:
            _choice(self.execution_mode, "execution_mode", EXECUTION_MODES)
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise _fail("async_scheduling", "a boolean or None", self.async_scheduling)
        if not isinstance(self.batch_invariant, bool):
            raise _fail("batch_invariant", "a boolean", self.batch_invariant)
        if self.attention_backend == "flash" and self.batch_invariant:
            raise ConfigError("attention_backend='flash' cannot honour batch_invariant=True (FlashAttention picks its "
                              "kernels and key splits from the batch shape); set batch_invariant=False")
        if self.cuda_graph_sizes is not None:
            if not isinstance(self.cuda_graph_sizes, (list, tuple)) or not self.cuda_graph_sizes or any(
                not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in self.cuda_graph_sizes
            ):
                raise _fail("cuda_graph_sizes", "a non-empty list of positive integers", self.cuda_graph_sizes)
        if self.speculative_config is not None and not isinstance(self.speculative_config, SpeculativeConfig):
            raise _fail("speculative_config", "a dict or SpeculativeConfig", self.speculative_config)
        _int(self.max_stop_strings, "max_stop_strings", 1)
        _int(self.max_stop_chars, "max_stop_chars", 1)
        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise _fail("generation_config", "'auto', 'vllm' or a directory holding generation_config.json",
                        self.generation_config)
        for name in ("enable_penalties", "enable_sleep_mode"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(name, "a boolean", getattr(self, name))
        if self.enable_sleep_mode and self.execution_mode == "compile":
            raise _fail("enable_sleep_mode", "False with execution_mode 'compile' (compiled programs keep the "
                        "addresses of the weights and the KV cache, which sleep mode moves)", self.enable_sleep_mode)
        if (not isinstance(self.profile_steps, (list, tuple)) or len(self.profile_steps) != 2
                or any(not isinstance(v, int) or v < 0 for v in self.profile_steps)):
            raise _fail("profile_steps", "(first_step >= 0, num_steps >= 0)", self.profile_steps)

    def validate_for_model(self, family: str, depth: int) -> None:
        """Checks that depend on the model family and its depth."""
        if family == "ouro":
            if self.exit_mode is not None:
                _choice(self.exit_mode, "exit_mode", OURO_EXIT_MODES)
            _choice(self.kv_layout, "kv_layout", ("last_exited", "shared"))
        else:
            if self.exit_mode is not None:
                _choice(self.exit_mode, "exit_mode", HUGINN_EXIT_MODES)
            m = _COMPRESS.match(self.kv_layout)
            if self.kv_layout not in ("last_exited", "shared") and not m:
                raise _fail("kv_layout", "'last_exited', 'shared' or 'compress-sN' (N a positive multiple of the core layers)", self.kv_layout)
        if self.exit_mode == "trace" and self.exit_trace is None:
            raise ConfigError("exit_mode='trace' needs exit_trace (a JSON file path or a {request_id: [depths]} dict)")
        if self.speculative_config is not None:
            self.speculative_config.validate(depth)
