"""Host→device metadata staging: one pinned buffer, one non-blocking copy per upload.

Fields are packed 8-byte aligned into a pinned uint8 host buffer and copied in one transfer
into a device buffer of the same size; the device-side fields are dtype views into it. With a
fixed layout (`StaticStaging`), the device views keep their addresses across steps, which is
what CUDA-graph replays need. The host side has two banks used alternately; each upload records
an event, and a bank is refilled only once its last copy has run (steps that read nothing back,
such as prefill chunks that sample no token, are never waited on otherwise, and graph replays let
the host run several steps ahead of the device).
"""

from __future__ import annotations

import numpy as np
import torch

_ALIGN = 8


def _nbytes(dtype: torch.dtype, n: int) -> int:
    return -(-(torch.empty((), dtype=dtype).element_size() * n) // _ALIGN) * _ALIGN


class StaticStaging:
    """Fixed named fields {name: (dtype, max_elems)} with stable device addresses."""

    def __init__(self, fields: dict[str, tuple[torch.dtype, int]], device: torch.device):
        self.device = device
        self.offsets: dict[str, tuple[int, torch.dtype, int]] = {}
        off = 0
        for name, (dtype, n) in fields.items():
            self.offsets[name] = (off, dtype, n)
            off += _nbytes(dtype, n)
        self.nbytes = max(off, _ALIGN)
        pin = device.type == "cuda"
        self.banks = [torch.zeros(self.nbytes, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self.bank_views = [{k: self._view(b, k) for k in self.offsets} for b in self.banks]
        self.dev = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
        self.dev_views = {k: self._view(self.dev, k) for k in self.offsets}
        self._bank = 0
        self._used = 0
        self._copied: list = [None, None]  # per bank: event recorded after its last upload (CUDA)

    def _view(self, buf: torch.Tensor, name: str) -> torch.Tensor:
        off, dtype, n = self.offsets[name]
        size = torch.empty((), dtype=dtype).element_size() * n
        return buf[off : off + size].view(dtype)

    def write(self, name: str, values) -> None:
        """Copy host values into the field (the rest of the field keeps its old contents)."""
        arr = np.asarray(values)
        copied = self._copied[self._bank]
        if copied is not None:  # the bank's previous upload may still be queued behind device work
            copied.synchronize()
            self._copied[self._bank] = None
        view = self.bank_views[self._bank][name]
        if arr.size > view.numel():
            raise ValueError(f"staging field {name!r} holds {view.numel()} values, got {arr.size}")
        view[: arr.size].copy_(torch.from_numpy(np.ascontiguousarray(arr)).to(view.dtype))
        off, _, _ = self.offsets[name]
        self._used = max(self._used, off + view.element_size() * arr.size)

    def upload(self) -> None:
        """One non-blocking copy of the used prefix of the host buffer to the device."""
        n = self._used
        if n:
            self.dev[:n].copy_(self.banks[self._bank][:n], non_blocking=True)
            if self.device.type == "cuda":
                self._copied[self._bank] = torch.cuda.Event()
                self._copied[self._bank].record()
        self._used = 0
        self._bank ^= 1

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.dev_views[name]


def upload_arrays(arrays: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """Pack variable-size arrays into one pinned buffer and upload them with one copy."""
    arrays = {k: np.ascontiguousarray(np.asarray(v).reshape(-1)) for k, v in arrays.items()}
    offsets, off = {}, 0
    for k, a in arrays.items():
        offsets[k] = off
        off += -(-max(a.nbytes, 1) // _ALIGN) * _ALIGN
    host = torch.empty(max(off, _ALIGN), dtype=torch.uint8, pin_memory=device.type == "cuda")
    for k, a in arrays.items():
        host[offsets[k] : offsets[k] + a.nbytes].copy_(torch.from_numpy(a.view(np.uint8)))
    dev = host.to(device, non_blocking=True)
    return {k: dev[offsets[k] : offsets[k] + a.nbytes].view(torch.from_numpy(a[:0]).dtype) for k, a in arrays.items()}
