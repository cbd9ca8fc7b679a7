"""Local checkpoints in the Hugging Face layout: resolve, validate, stream, write.

A checkpoint directory holds `config.json` (parsed strictly, never with remote code) and either
`model.safetensors` or `model.safetensors.index.json` plus its shards. `iter_checkpoint`
validates every file header, key, dtype and shape before it yields the first tensor, then
streams tensors one at a time (a shard is never loaded whole). Pickle files are refused.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Iterable, Iterator, Mapping, Optional

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..errors import CheckpointError
from .configs import OPTIONAL_EXTRA_TENSORS, ModelConfig, config_from_dict, config_to_dict, hf_weight_shapes
from .presets import PRESETS

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")

# safetensors dtype tag -> (torch dtype, bytes per element); only floating point weights are loaded.
_FLOAT_DTYPES = {
    "F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
}
_TAG = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def resolve_model(name_or_path: str) -> tuple[str, str]:
    """("dir", path) for an existing directory (checked first, `~` expanded), ("preset", name) for a preset."""
    path = os.path.expanduser(name_or_path)
    if os.path.isdir(path):
        return "dir", path
    if name_or_path in PRESETS:
        return "preset", name_or_path
    raise CheckpointError(
        f"model {name_or_path!r} is neither an existing checkpoint directory nor a preset name; "
        f"presets: {', '.join(sorted(PRESETS))}")


def load_config(model_dir: str) -> ModelConfig:
    """Parse `<model_dir>/config.json` strictly (unsupported fields raise ConfigError)."""
    path = os.path.join(model_dir, CONFIG_FILE)
    data = _read_json(path, "model config")
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return config_from_dict(data, source=path)


def _read_json(path: str, what: str):
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: {what} file not found")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: invalid JSON ({exc})") from exc


def _read_header(path: str) -> dict[str, tuple[torch.dtype, tuple]]:
    """Parse and check one safetensors header: {name: (dtype, shape)} in data order. Reads no data."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise CheckpointError(f"{path}: corrupt or truncated safetensors header "
                                  f"(header claims {n} bytes, file has {size})")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: corrupt safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    data_size = size - 8 - n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            tag, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            if not all(isinstance(d, int) and d >= 0 for d in shape):
                raise ValueError(f"bad shape {shape}")
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{path}: corrupt safetensors header entry for tensor {name!r} ({exc})") from exc
        if tag not in _FLOAT_DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {tag}; weights must be one of "
                                  f"{sorted(_FLOAT_DTYPES)}")
        dtype, itemsize = _FLOAT_DTYPES[tag]
        if end - begin != math.prod(shape) * itemsize or begin < 0:
            raise CheckpointError(f"{path}: corrupt safetensors header: tensor {name!r} offsets "
                                  f"[{begin}, {end}] do not match shape {list(shape)} and dtype {tag}")
        if end > data_size:
            raise CheckpointError(f"{path}: truncated safetensors file: tensor {name!r} ends at byte {end} "
                                  f"of the data section but only {data_size} bytes are present")
        out[name] = (dtype, shape, begin)
    return {name: (dtype, shape) for name, (dtype, shape, _) in sorted(out.items(), key=lambda kv: kv[1][2])}


def _checkpoint_files(model_dir: str) -> dict[str, dict[str, tuple[torch.dtype, tuple]]]:
    """{file path: header} for the checkpoint's safetensors files (single file or sharded)."""
    single, index = os.path.join(model_dir, SINGLE_FILE), os.path.join(model_dir, INDEX_FILE)
    if os.path.isfile(single) and os.path.isfile(index):
        raise CheckpointError(f"{model_dir}: both {SINGLE_FILE} and {INDEX_FILE} are present; keep one")
    if os.path.isfile(single):
        return {single: _read_header(single)}
    if not os.path.isfile(index):
        pickles = sorted(f for f in os.listdir(model_dir) if f.endswith(PICKLE_SUFFIXES))
        if pickles:
            raise CheckpointError(
                f"{model_dir}: found only pickle weight files ({', '.join(pickles)}); pickle checkpoints are "
                f"refused because loading them can run arbitrary code. Convert them to safetensors "
                f"({SINGLE_FILE} or a sharded {INDEX_FILE}).")
        raise CheckpointError(f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE} found")
    data = _read_json(index, "safetensors index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: expected a 'weight_map' object mapping tensor names to shard files")
    files = {}
    for shard in sorted(set(weight_map.values())):
        path = os.path.join(model_dir, shard)
        if os.path.basename(shard) != shard or not os.path.isfile(path):
            raise CheckpointError(f"{index}: shard file {shard!r} not found in {model_dir}")
        files[path] = _read_header(path)
    for name, shard in weight_map.items():
        if name not in files[os.path.join(model_dir, shard)]:
            raise CheckpointError(f"{index}: tensor {name!r} is mapped to {shard} but that file does not contain it")
    for path, header in files.items():
        for name in header:
            if weight_map.get(name) != os.path.basename(path):
                raise CheckpointError(f"{path}: tensor {name!r} is not mapped to this file in {INDEX_FILE}")
    return files


def _validate(files: dict, config: ModelConfig) -> None:
    expected = hf_weight_shapes(config)
    extras = OPTIONAL_EXTRA_TENSORS[config.family]
    seen: dict[str, str] = {}
    for path, header in files.items():
        for name, (_, shape) in header.items():
            if name in seen:
                raise CheckpointError(f"{path}: tensor {name!r} also appears in {seen[name]}")
            seen[name] = path
            if name in expected:
                if shape != tuple(expected[name]):
                    raise CheckpointError(f"{path}: tensor {name!r} has shape {list(shape)}, "
                                          f"expected {list(expected[name])} for this config")
            elif name not in extras:
                raise CheckpointError(f"{path}: unexpected tensor {name!r} for model_type {config.model_type!r}")
    missing = [n for n in expected if n not in seen]
    if missing:
        where = ", ".join(os.path.basename(p) for p in files)
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"{where}: missing tensors {missing[:5]}{more}")
    if config.family == "huginn" and "lm_head.weight" in seen:
        head, embedding = files[seen["lm_head.weight"]]["lm_head.weight"][1], expected["transformer.wte.weight"]
        if head != tuple(embedding):
            raise CheckpointError(f"{seen['lm_head.weight']}: tensor 'lm_head.weight' (the tied duplicate) has "
                                  f"shape {list(head)}, expected the embedding's {list(embedding)}")


def iter_checkpoint(model_dir: str, config: ModelConfig, *, device="cpu",
                    dtype: Optional[torch.dtype] = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Validate the whole checkpoint, then yield (hf_name, tensor) one tensor at a time, in file order.

    dtype None keeps bf16/fp16 tensors and casts fp32/fp64 ones to bf16 (Huginn ships fp32).
    Huginn's `freqs_cis` and duplicate `lm_head.weight` are dropped. Validation runs when the
    iterator is created, so errors surface before any tensor is allocated.
    """
    files = _checkpoint_files(model_dir)
    _validate(files, config)
    extras = OPTIONAL_EXTRA_TENSORS[config.family]
    return _stream(files, extras, torch.device(device), dtype)


def _stream(files, extras, device, dtype) -> Iterator[tuple[str, torch.Tensor]]:
    for path, header in files.items():
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                for name, (src_dtype, _) in header.items():
                    if name in extras:
                        continue
                    target = dtype or (src_dtype if src_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16)
                    yield name, f.get_tensor(name).to(device=device, dtype=target)
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(f"{path}: cannot read tensor data ({exc})") from exc


def save_checkpoint(model_dir: str, config: ModelConfig,
                    tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], *,
                    tokenizer=None, max_shard_bytes: Optional[int] = None,
                    dtype: Optional[torch.dtype] = None) -> None:
    """Write a loadable checkpoint: config.json, safetensors (sharded past max_shard_bytes), tokenizer.

    `tensors` holds every name of hf_weight_shapes(config) (plus the family's optional extras,
    e.g. Huginn's duplicate lm_head); shapes are checked. `dtype` casts on write. Shards are
    written as they fill, so only one shard is held in memory.
    """
    os.makedirs(model_dir, exist_ok=True)
    expected = hf_weight_shapes(config)
    extras = OPTIONAL_EXTRA_TENSORS[config.family]
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    shards: list[dict[str, torch.Tensor]] = [{}]
    shard_bytes, total_bytes, written, names = 0, 0, [], set()

    def flush():
        tmp = os.path.join(model_dir, f".shard-{len(written):05d}.tmp")
        save_file(shards[-1], tmp)
        written.append((tmp, list(shards[-1])))
        shards[-1] = {}

    for name, t in items:
        if name not in expected and name not in extras:
            raise CheckpointError(f"save_checkpoint: unexpected tensor {name!r} for model_type {config.model_type!r}")
        if name in expected and tuple(t.shape) != tuple(expected[name]):
            raise CheckpointError(f"save_checkpoint: tensor {name!r} has shape {list(t.shape)}, "
                                  f"expected {list(expected[name])}")
        if name in names:
            raise CheckpointError(f"save_checkpoint: tensor {name!r} given twice")
        t = t.detach().to(device="cpu", dtype=dtype or t.dtype).contiguous()
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes is not None and shards[-1] and shard_bytes + nbytes > max_shard_bytes:
            flush()
            shard_bytes = 0
        shards[-1][name] = t
        shard_bytes += nbytes
        total_bytes += nbytes
        names.add(name)
    missing = [n for n in expected if n not in names]
    if missing:
        raise CheckpointError(f"save_checkpoint: missing tensors {missing[:5]}")
    if shards[-1] or not written:
        flush()

    for stale in (SINGLE_FILE, INDEX_FILE):
        if os.path.exists(os.path.join(model_dir, stale)):
            os.remove(os.path.join(model_dir, stale))
    if len(written) == 1:
        os.replace(written[0][0], os.path.join(model_dir, SINGLE_FILE))
    else:
        weight_map = {}
        for i, (tmp, shard_names) in enumerate(written):
            fname = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
            os.replace(tmp, os.path.join(model_dir, fname))
            weight_map.update({n: fname for n in shard_names})
        with open(os.path.join(model_dir, INDEX_FILE), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": total_bytes}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(model_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(config_to_dict(config), f, indent=2)
    if tokenizer is not None:
        tokenizer.save(model_dir)
