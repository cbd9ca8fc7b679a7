"""User-facing entry points: the LLM class, the rlt-generate CLI, the server and the benchmarks."""
