"""Device side of the engine: model runner, forward batches, CUDA graphs, speculation."""
