"""rlt runtime: engine, models and entry points for looped language models."""

from .config import EngineConfig, SpeculativeConfig
from .entrypoints.llm import LLM
from .errors import CheckpointError, ConfigError, RequestError, RltError
from .guided_decoding import GuidedDecoding
from .outputs import CompletionOutput, RequestOutput, TokenLogprob
from .sampling_params import SamplingParams

__all__ = [
    "LLM", "SamplingParams", "GuidedDecoding", "RequestOutput", "CompletionOutput", "TokenLogprob", "EngineConfig",
    "SpeculativeConfig", "RltError", "ConfigError", "CheckpointError", "RequestError",
]
