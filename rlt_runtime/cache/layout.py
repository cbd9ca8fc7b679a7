"""KV layouts: how loops map onto the planes of the paged cache (docs/design.md, "Loops, planes").

A layout answers two questions for the model: which plane a layer writes at loop t, and which
plane-selection rule its attention uses (``plane_offset + min(t, key_depth) % modulus``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class PlaneSpec:
    """Write plane and read rule of one attention call."""

    write_plane: int
    query_depth: int
    plane_offset: int
    plane_modulus: int
    use_key_depth: bool


@dataclass(frozen=True)
class KVLayout:
    """Plane structure of a model's cache.

    depth: loops a token may run (D). core_planes: planes holding loop-dependent K/V
    (D for last_exited, fewer when loops share planes). core_offset: index of the first core
    plane (Huginn keeps prelude/coda K/V in plane 0). num_cache_layers: layer slots per block.
    """

    name: str
    depth: int
    core_planes: int
    core_offset: int
    num_cache_layers: int
    copy_reads: bool = False  # exited tokens' K/V is copied into deeper planes; reads use the query's plane

    @property
    def num_planes(self) -> int:
        return self.core_offset + self.core_planes

    @property
    def use_key_depth_reads(self) -> bool:
        """Looped layers read exited keys through the key-depth table (several planes, no copies)."""
        return self.core_planes > 1 and not self.copy_reads

    @property
    def shares_planes(self) -> bool:
        """Loops overwrite each other's K/V: prefill must advance position by position."""
        return self.core_planes < self.depth

    def core(self, t: int) -> PlaneSpec:
        """Plane spec of a looped layer at loop t (0-based). Loop 0 reads no key depths: every key
        ran at least loop 0, so none is read from another plane there."""
        return PlaneSpec(
            write_plane=self.core_offset + t % self.core_planes,
            query_depth=t,
            plane_offset=self.core_offset,
            plane_modulus=self.core_planes,
            use_key_depth=self.use_key_depth_reads and t > 0,
        )

    def boundary(self) -> PlaneSpec:
        """Plane spec of Huginn's prelude and coda layers (run once per token)."""
        return PlaneSpec(write_plane=0, query_depth=0, plane_offset=0, plane_modulus=1, use_key_depth=False)

    def key_depth_plane(self) -> PlaneSpec:
        """Plane spec of plane 0 at loop 0, whose slot mapping indexes the key-depth table (a
        token's key depth lives beside its plane-0 K/V): the boundary plane where the layout has
        one (Huginn), else the first core plane (Ouro)."""
        return self.boundary() if self.core_offset else self.core(0)


def make_layout(model_config, kv_layout: str, depth: int, copy_reads: bool = False) -> KVLayout:
    """Build the layout for a model family and a `kv_layout` option value.

    copy_reads selects the copy-based LAST_EXITED finalize instead of the attention kernel's
    key-depth indirection (only for layouts with one plane per loop)."""
    layout = _make_layout(model_config, kv_layout, depth)
    if copy_reads:
        if layout.core_planes != depth:
            raise ConfigError(f"last_exited_reads='copy' needs one plane per loop (kv_layout 'last_exited'), got {kv_layout!r}")
        layout = dataclasses.replace(layout, copy_reads=True)
    return layout


def _make_layout(model_config, kv_layout: str, depth: int) -> KVLayout:
    if model_config.family == "ouro":
        planes = {"last_exited": depth, "shared": 1}.get(kv_layout)
        if planes is None:
            raise ConfigError(f"kv_layout must be 'last_exited' or 'shared' for Ouro, got {kv_layout!r}")
        return KVLayout(kv_layout, depth, planes, 0, model_config.num_hidden_layers)
    core_layers = model_config.n_layers_in_recurrent_block
    boundary_layers = model_config.n_layers_in_prelude + model_config.n_layers_in_coda
    cache_layers = max(core_layers, boundary_layers)
    if kv_layout == "last_exited":
        planes = depth
    elif kv_layout == "shared":
        planes = 1
    else:
        m = re.match(r"^compress-s(\d+)$", kv_layout)
        n = int(m.group(1)) if m else 0
        if not m or n < core_layers or n % core_layers:
            raise ConfigError(
                f"kv_layout must be 'last_exited', 'shared' or 'compress-sN' with N a positive multiple of "
                f"{core_layers} (the core layers), got {kv_layout!r}"
            )
        planes = min(n // core_layers, depth)
    return KVLayout(kv_layout, depth, planes, 1, cache_layers)
