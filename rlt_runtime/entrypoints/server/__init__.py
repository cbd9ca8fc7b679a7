"""OpenAI-compatible HTTP server (`rlt-serve`): FastAPI app, engine owner thread, metrics."""

from .app import ServerConfig, create_app
from .metrics import ServerMetrics
from .worker import EngineWorker, GenerationStream

__all__ = ["EngineWorker", "GenerationStream", "ServerConfig", "ServerMetrics", "create_app"]
