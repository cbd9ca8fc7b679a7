"""Paged KV cache: layouts (planes), block pool, per-request tables, prefix cache, capacity planning."""
