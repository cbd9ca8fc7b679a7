"""Local checkpoints in the Hugging Face layout: resolve, validate, stream, write.

A checkpoint directory holds `config.json` (parsed strictly, never with remote code) and either
`model.safetensors` or `model.safetensors.index.json` plus its shards. `iter_checkpoint`
validates every file header, key, dtype and shape before it yields the first tensor, then
streams tensors one at a time (a shard is never loaded whole). Pickle files are refused.

A safetensors header is parsed here, before the safetensors library sees the file, and held to
the library's rules so that a file that passes can be read: at most 100 MB and 3 levels of JSON
nesting (checked on the raw text, so deep nesting cannot exhaust the parser), no duplicate keys
or NaN/Infinity literals, `__metadata__` a map of strings, and each entry exactly `dtype` (a float
tag), `shape` (non-negative integers) and `data_offsets` (two integers) whose size matches; the
entries, sorted by offset, tile the data section without gap or overlap. Every error is a
CheckpointError naming the file and the entry.
"""

from __future__ import annotations

import json
import os
import re
import struct
from typing import Iterable, Iterator, Mapping, Optional

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..errors import CheckpointError
from .config_fields import shown
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
# The safetensors library's own bound on the header.
MAX_HEADER_BYTES = 100_000_000
# {name: {"shape": [...]}}: a valid header nests three containers deep.
MAX_HEADER_DEPTH = 3
_ENTRY_KEYS = ("dtype", "shape", "data_offsets")
# A JSON string literal or a bracket: nesting is counted on these tokens alone.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def resolve_model(name_or_path: str, *, revision: Optional[str] = None,
                  download_dir: Optional[str] = None) -> tuple[str, str]:
    """("dir", path) for an existing directory (checked first, `~` expanded), ("preset", name) for a
    preset, ("dir", snapshot path) for a Hugging Face Hub name `namespace/name` (rlt_runtime/models/hub.py:
    the local cache first, then a download unless offline). `revision` applies to Hub names only."""
    from .hub import looks_like_repo_id, resolve_repo

    path = os.path.expanduser(name_or_path)
    local = os.path.isdir(path)
    if (local or name_or_path in PRESETS) and revision is not None:
        kind = "a local directory" if local else "a preset"
        raise CheckpointError(f"revision {revision!r} was given but model {name_or_path!r} is {kind}; "
                              "revision applies to Hugging Face Hub names (namespace/name) only")
    if local:
        return "dir", path
    if name_or_path in PRESETS:
        return "preset", name_or_path
    if looks_like_repo_id(name_or_path):
        try:
            return "dir", resolve_repo(name_or_path, revision=revision, download_dir=download_dir)
        except CheckpointError as exc:
            raise CheckpointError(f"model {name_or_path!r} is not an existing directory or a preset name, and as a "
                                  f"Hugging Face Hub name: {exc}") from None
    raise CheckpointError(
        f"model {name_or_path!r} is neither an existing checkpoint directory nor a preset name; "
        f"presets: {', '.join(sorted(PRESETS))}; Hugging Face Hub names are namespace/name")


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
    except ValueError as exc:  # bad syntax or encoding, an integer of too many digits
        raise CheckpointError(f"{path}: invalid JSON ({exc})") from exc
    except RecursionError as exc:
        raise CheckpointError(f"{path}: invalid JSON (nested too deeply)") from exc


def _read_header(path: str) -> dict[str, tuple[torch.dtype, tuple]]:
    """Parse and check one safetensors header (module docstring): {name: (dtype, shape)} in data order.
    Reads no tensor data."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise CheckpointError(f"{path}: corrupt or truncated safetensors header "
                                  f"(header claims {n} bytes, file has {size})")
        if n > MAX_HEADER_BYTES:
            raise CheckpointError(f"{path}: corrupt safetensors header: {n} bytes, more than the "
                                  f"{MAX_HEADER_BYTES} safetensors allows")
        raw = f.read(n)
    header = _parse_header_json(path, raw)
    data_size = size - 8 - n
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CheckpointError(f"{path}: corrupt safetensors header: '__metadata__' must be a map of strings, "
                              f"got {shown(meta)}")
    entries = sorted((_header_entry(path, name, info, data_size) for name, info in header.items()),
                     key=lambda e: (e[2], e[3]))
    covered, previous = 0, None
    for name, _, begin, end, _ in entries:
        if begin != covered:
            problem = f"overlaps tensor {previous!r}" if begin < covered else "leaves a gap after " + (
                f"tensor {previous!r}" if previous else "the header")
            raise CheckpointError(f"{path}: corrupt safetensors header: tensor {name!r} at data offsets "
                                  f"[{begin}, {end}] {problem} (which ends at {covered})")
        covered, previous = end, name
    if covered != data_size:
        raise CheckpointError(f"{path}: corrupt safetensors header: the data section has {data_size} bytes but "
                              f"the tensors cover {covered}")
    return {name: (dtype, shape) for name, dtype, _, _, shape in entries}


def _parse_header_json(path: str, raw: bytes) -> dict:
    """The header's JSON object; nesting is bounded on the raw text before the parser runs."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: corrupt safetensors header ({exc})") from exc
    depth, entry = 0, None
    for token in _JSON_TOKEN.finditer(text):
        token = token.group()
        if token[0] == '"':
            if depth == 1:  # a top-level key (or a malformed top-level value)
                entry = token
        elif token in "[{":
            depth += 1
            if depth > MAX_HEADER_DEPTH:
                where = "at the top level" if entry is None else f"in entry {entry[1:-1][:80]!r}"
                raise CheckpointError(f"{path}: corrupt safetensors header: JSON nested deeper than the "
                                      f"{MAX_HEADER_DEPTH} levels of a safetensors header ({where})")
        else:
            depth -= 1

    def unique(pairs):
        found = dict(pairs)
        if len(found) < len(pairs):
            seen = set()
            duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise ValueError(f"key {duplicate!r} appears twice")
        return found

    def no_constant(name):
        raise ValueError(f"{name} is not JSON")

    try:
        header = json.loads(text, object_pairs_hook=unique, parse_constant=no_constant)
    except ValueError as exc:  # bad syntax, a duplicate key, NaN/Infinity, an integer of too many digits
        raise CheckpointError(f"{path}: corrupt safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    return header


def _header_entry(path: str, name: str, info, data_size: int):
    """(name, dtype, begin, end, shape) of one header entry, every field checked."""
    where = f"{path}: corrupt safetensors header: tensor {name!r}"
    if not isinstance(info, dict) or sorted(info) != sorted(_ENTRY_KEYS):
        raise CheckpointError(f"{where} must be an object with exactly the keys {list(_ENTRY_KEYS)}, "
                              f"got {shown(info)}")
    tag, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(tag, str) or tag not in _FLOAT_DTYPES:
        label = tag[:40] if isinstance(tag, str) else shown(tag)
        raise CheckpointError(f"{path}: tensor {name!r} has dtype {label}; weights must be one of "
                              f"{sorted(_FLOAT_DTYPES)}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CheckpointError(f"{where} has shape {shown(shape)}; expected a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise CheckpointError(f"{where} has data_offsets {shown(offsets)}; expected [begin, end], "
                              f"integers with 0 <= begin <= end")
    dtype, itemsize = _FLOAT_DTYPES[tag]
    begin, end = offsets
    if end - begin != _nbytes(shape, itemsize, data_size):
        raise CheckpointError(f"{where} offsets [{begin}, {end}] do not match shape {shown(shape)} and dtype {tag}")
    if end > data_size:
        raise CheckpointError(f"{path}: truncated safetensors file: tensor {name!r} ends at byte {end} "
                              f"of the data section but only {data_size} bytes are present")
    return name, dtype, begin, end, tuple(shape)


def _nbytes(shape: list, itemsize: int, limit: int) -> int:
    """Bytes of a tensor of `shape`, or -1 once past `limit` (a crafted shape of many huge
    dimensions would otherwise make a product of millions of digits)."""
    if 0 in shape:
        return 0
    n = itemsize
    for d in shape:
        n *= d
        if n > limit:
            return -1
    return n


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
