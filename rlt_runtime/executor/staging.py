"""Host→device metadata staging: one pinned buffer, one non-blocking copy per step.

Fields are packed 8-byte aligned into a pinned uint8 host buffer and copied in one transfer
into a device buffer of the same size; the device-side fields are dtype views into it. With a
fixed layout (`StaticStaging`), the device views keep their addresses across steps, which is
what CUDA-graph replays need.
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
        self.host = torch.zeros(self.nbytes, dtype=torch.uint8, pin_memory=pin)
        self.dev = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
        self.host_views = {k: self._view(self.host, k) for k in self.offsets}
        self.dev_views = {k: self._view(self.dev, k) for k in self.offsets}
        self._used = 0

    def _view(self, buf: torch.Tensor, name: str) -> torch.Tensor:
        off, dtype, n = self.offsets[name]
        size = torch.empty((), dtype=dtype).element_size() * n
        return buf[off : off + size].view(dtype)

    def write(self, name: str, values) -> None:
        """Copy host values into the field (the rest of the field keeps its old contents)."""
        arr = np.asarray(values)
        view = self.host_views[name]
        if arr.size > view.numel():
            raise ValueError(f"staging field {name!r} holds {view.numel()} values, got {arr.size}")
        view[: arr.size].copy_(torch.from_numpy(np.ascontiguousarray(arr)).to(view.dtype))
        off, _, _ = self.offsets[name]
        self._used = max(self._used, off + view.element_size() * arr.size)

    def upload(self) -> None:
        """One non-blocking copy of the used prefix of the host buffer to the device."""
        n = self._used
        if n:
            self.dev[:n].copy_(self.host[:n], non_blocking=True)
        self._used = 0

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.dev_views[name]


def upload_arrays(arrays: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """Pack variable-size arrays into one pinned buffer and upload them with one copy."""
    fields = {k: (torch.from_numpy(np.asarray(v)).dtype, max(1, np.asarray(v).size)) for k, v in arrays.items()}
    st = StaticStaging(fields, device)
    for k, v in arrays.items():
        st.write(k, np.asarray(v).reshape(-1))
    st._used = st.nbytes
    st.upload()
    return {k: st[k][: max(0, np.asarray(v).size)] for k, v in arrays.items()}
