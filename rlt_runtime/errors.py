"""Error types. Every message names the offending field, file or tensor and the allowed values."""


class RltError(Exception):
    """Base class of rlt errors."""


class ConfigError(RltError, ValueError):
    """An invalid engine, model or sampling configuration."""


class CheckpointError(RltError, ValueError):
    """A checkpoint that cannot be loaded (missing/unexpected/mis-shaped tensors, bad files)."""


class RequestError(RltError, ValueError):
    """A request rejected at admission (bad prompt, parameters or limits)."""


class ReplicaError(RltError):
    """An engine replica failed (its process died or its step raised); the message says which and why."""
