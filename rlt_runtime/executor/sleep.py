"""Sleep mode: a worker hands the device memory of its weights and its KV cache back while the
engine idles (e.g. while a trainer shares the GPU), and takes it again on wake-up.

Each tensor keeps its Python object and its storage object: the storage is resized to nothing
(its memory returns to the allocator, and with `torch.cuda.empty_cache` to the device) and later
resized back, so every model attribute, view and dataclass that holds it stays valid. The
addresses change, so the worker drops its CUDA graphs at sleep and captures them again at
wake-up. Weights slept at level 1 are kept in (pinned) host memory and copied back; at level 2
they are discarded and come back as zeros, for `update_weights` to fill. The KV cache always
comes back as zeros, as a newly allocated pool is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch

TAGS = ("weights", "kv_cache")  # what wakes up separately (vLLM's tags)


@dataclass
class Released:
    """Storages given back: each with its size in bytes and its host copy (None: discarded)."""

    storages: list = field(default_factory=list)  # [(untyped storage, nbytes, host uint8 tensor or None)]

    @property
    def nbytes(self) -> int:
        return sum(n for _, n, _ in self.storages)


def release(tensors: Iterable[torch.Tensor], keep: bool) -> Released:
    """Give back the storage of every tensor (each storage once); with keep, copy its bytes to the
    host first (pinned memory for a CUDA storage). A storage that cannot be resized (host memory
    mapped from a checkpoint file, which CPU engines read in place) stays; without keep it is
    zeroed instead, as if discarded."""
    out, seen = Released(), set()
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        if not storage.resizable():
            if not keep:
                _bytes(storage).zero_()
            continue
        host = None
        if keep:
            data = _bytes(storage)
            host = torch.empty(data.shape, dtype=torch.uint8, pin_memory=data.is_cuda).copy_(data)
        out.storages.append((storage, storage.nbytes(), host))
    for storage, _, _ in out.storages:
        storage.resize_(0)
    return out


def restore(released: Released) -> None:
    """Take the storages' memory again: their host copies, or zeros."""
    for storage, nbytes, host in released.storages:
        storage.resize_(nbytes)
        data = _bytes(storage)
        if host is None:
            data.zero_()
        else:
            data.copy_(host)


def _bytes(storage) -> torch.Tensor:
    """A uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def kv_tensors(kv) -> list[torch.Tensor]:
    """The KV pool's K and V planes and key depths (not the block tables or the FP8 scales: small,
    and the scales are constants the pool was made with)."""
    return [kv.k, kv.v, kv.key_depth]


def check_tags(tags: Optional[Iterable[str]]) -> list[str]:
    """The tags to wake (None: all); ValueError naming an unknown one."""
    if tags is None:
        return list(TAGS)
    tags = list(tags)
    bad = [t for t in tags if t not in TAGS]
    if bad:
        raise ValueError(f"wake_up tags must be among {list(TAGS)}, got {bad}")
    return tags
