"""Models by Hugging Face Hub name: resolved from a fake Hub cache on disk (the real layout:
models--org--name/{blobs, refs/<ref>, snapshots/<commit>/<symlinks into blobs>}), offline; downloads
are checked against a stand-in for huggingface_hub.snapshot_download.

Each snapshot holds a tiny Ouro checkpoint written from a preset with its own seed, so a snapshot is
identified by its outputs: greedy tokens equal those of the preset built with that seed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import huggingface_hub
import pytest

from rlt_runtime import LLM, ConfigError, SamplingParams
from rlt_runtime.entrypoints import cli
from rlt_runtime.errors import CheckpointError
from rlt_runtime.models.checkpoint import resolve_model, save_checkpoint
from rlt_runtime.models.hub import ALLOW_PATTERNS
from rlt_runtime.models.presets import preset_config, preset_weights
from rlt_runtime.models.tokenizer import builtin_tokenizer

REPO = "tiny-org/Ouro-Tiny"
MAIN, V2 = "a" * 40, "b" * 40  # commits of the snapshots refs/main and refs/v2 point at
SEEDS = {MAIN: 1, V2: 2}
TINY = dict(dtype="float32", device="cpu", max_num_seqs=2, num_blocks=64, max_model_len=64)
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
PROMPT = [5, 17, 42, 7]
REMOTE_CODE = "import pathlib; pathlib.Path(__file__).with_name('REMOTE_CODE_RAN').write_text('yes')\n"


def _write_snapshot(repo_dir, commit: str, seed: int, refs=()) -> None:
    """A snapshot in the Hub cache layout: files stored as blobs named by their hash, linked from
    snapshots/<commit>; a config that names remote code (auto_map) and ships it."""
    cfg = preset_config("ouro-tiny")
    staging = repo_dir / "staging"
    save_checkpoint(str(staging), cfg, preset_weights(cfg, seed=seed), tokenizer=builtin_tokenizer(cfg))
    config = json.loads((staging / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_ouro.OuroConfig",
                          "AutoModelForCausalLM": "modeling_ouro.OuroForCausalLM"}
    (staging / "config.json").write_text(json.dumps(config))
    (staging / "modeling_ouro.py").write_text(REMOTE_CODE)
    (staging / "configuration_ouro.py").write_text(REMOTE_CODE)
    snapshot = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for f in sorted(staging.iterdir()):
        blob = repo_dir / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.move(str(f), blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    staging.rmdir()
    (repo_dir / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo_dir / "refs" / ref).write_text(commit)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A Hub cache holding REPO at two revisions: refs/main -> MAIN (seed 1), refs/v2 -> V2 (seed 2)."""
    root = tmp_path_factory.mktemp("hf-cache")
    repo_dir = root / ("models--" + REPO.replace("/", "--"))
    _write_snapshot(repo_dir, MAIN, SEEDS[MAIN], refs=("main",))
    _write_snapshot(repo_dir, V2, SEEDS[V2], refs=("v2",))
    return root


@pytest.fixture
def offline_cache(hub_cache, monkeypatch):
    """HF_HUB_OFFLINE=1 with HF_HUB_CACHE pointing at the fake cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    return hub_cache


@pytest.fixture(scope="module")
def preset_tokens():
    """Greedy tokens of the ouro-tiny preset initialised with each snapshot's seed (the reference)."""
    return {seed: LLM("ouro-tiny", seed=seed, **TINY).generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
            for seed in SEEDS.values()}


def _tokens(llm: LLM) -> list[int]:
    return llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_hub_name_and_revisions_load_their_snapshot(offline_cache, preset_tokens):
    assert preset_tokens[1] != preset_tokens[2]  # the two snapshots are told apart by their outputs
    repo_dir = offline_cache / "models--tiny-org--Ouro-Tiny"
    assert resolve_model(REPO) == ("dir", str(repo_dir / "snapshots" / MAIN))
    assert resolve_model(REPO, revision="v2") == ("dir", str(repo_dir / "snapshots" / V2))
    assert _tokens(LLM(REPO, **TINY)) == preset_tokens[1]
    assert _tokens(LLM(REPO, revision="v2", **TINY)) == preset_tokens[2]
    assert _tokens(LLM(REPO, revision=V2, **TINY)) == preset_tokens[2]  # a commit hash
    assert not (repo_dir / "blobs" / "REMOTE_CODE_RAN").exists()
    assert not list(repo_dir.rglob("REMOTE_CODE_RAN"))  # auto_map's modeling code was never imported


def test_cli_takes_hub_name_revision_and_download_dir(hub_cache, preset_tokens, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # empty: --download-dir must win
    argv = ["--model", REPO, "--revision", "v2", "--download-dir", str(hub_cache), "--prompt", "hi", "--json",
            "--max-tokens", "3", "--temperature", "0", "--ignore-eos", "--dtype", "float32", "--device", "cpu",
            "--num-blocks", "64", "--max-model-len", "64"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    want = LLM("ouro-tiny", seed=2, **TINY).generate("hi", SamplingParams(max_tokens=3, temperature=0, ignore_eos=True),
                                                     use_tqdm=False)[0]
    assert out["outputs"][0]["token_ids"] == want.outputs[0].token_ids


def test_hf_home_is_honoured(hub_cache, monkeypatch, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(hub_cache, home / "hub", symlinks=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    assert resolve_model(REPO)[1] == str(home / "hub" / "models--tiny-org--Ouro-Tiny" / "snapshots" / MAIN)


def test_missing_names_say_where_they_looked(offline_cache, tmp_path):
    with pytest.raises(CheckpointError) as err:
        LLM("tiny-org/Nope", **TINY)
    message = str(err.value)
    assert "'tiny-org/Nope'" in message and str(offline_cache) in message and "HF_HUB_OFFLINE" in message
    assert "revision 'main'" in message
    with pytest.raises(CheckpointError, match=r"revision 'v9'.*HF_HUB_OFFLINE"):
        resolve_model(REPO, revision="v9")
    with pytest.raises(CheckpointError, match=f"looked in the Hugging Face cache {tmp_path}"):
        resolve_model(REPO, download_dir=str(tmp_path))
    with pytest.raises(CheckpointError, match="revision 'v2' was given but model 'ouro-tiny' is a preset"):
        resolve_model("ouro-tiny", revision="v2")
    with pytest.raises(CheckpointError, match="neither an existing checkpoint directory nor a preset name"):
        resolve_model("./not/here")  # a path, never looked up on the Hub


def test_incomplete_snapshot_offline_names_the_missing_file(offline_cache, tmp_path):
    repo_dir = tmp_path / "models--tiny-org--Partial"
    (repo_dir / "snapshots" / MAIN).mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(MAIN)
    (repo_dir / "snapshots" / MAIN / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"model\.safetensors .* is not there, and HF_HUB_OFFLINE is set"):
        resolve_model("tiny-org/Partial", download_dir=str(tmp_path))


class _FakeHub:
    """Stands in for huggingface_hub.snapshot_download: local look-ups behave as the real one; a
    download copies the snapshot from `source` (a fake remote) into the cache, keeping only the
    files matched by allow_patterns, and records the call."""

    def __init__(self, source):
        self.source, self.downloads = source, []
        self.real = huggingface_hub.snapshot_download

    def __call__(self, repo_id, *, revision=None, cache_dir=None, local_files_only=False, allow_patterns=None, **kw):
        if local_files_only:
            return self.real(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True)
        from huggingface_hub.utils import filter_repo_objects

        self.downloads.append((repo_id, revision, cache_dir, list(allow_patterns)))
        name = "models--" + repo_id.replace("/", "--")
        src = self.source / name / "snapshots" / MAIN
        dst = os.path.join(cache_dir, name, "snapshots", MAIN)
        os.makedirs(dst, exist_ok=True)
        for f in filter_repo_objects(sorted(os.listdir(src)), allow_patterns=allow_patterns):
            shutil.copy(src / f, dst)
        os.makedirs(os.path.join(cache_dir, name, "refs"), exist_ok=True)
        with open(os.path.join(cache_dir, name, "refs", "main"), "w") as f:
            f.write(MAIN)
        return dst


def test_online_downloads_only_what_rlt_reads_once(hub_cache, monkeypatch, tmp_path, preset_tokens):
    fake = _FakeHub(hub_cache)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert _tokens(LLM(REPO, **TINY)) == preset_tokens[1]
    assert fake.downloads == [(REPO, None, str(cache), ALLOW_PATTERNS)]
    snapshot = cache / "models--tiny-org--Ouro-Tiny" / "snapshots" / MAIN
    assert not list(snapshot.glob("*.py"))  # remote code is never even downloaded
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(snapshot))
    assert _tokens(LLM(REPO, **TINY)) == preset_tokens[1]
    assert len(fake.downloads) == 1  # the second load came from the cache


def test_online_download_failure_is_reported(monkeypatch, tmp_path):
    def refuse(repo_id, *, local_files_only=False, **kw):
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        raise OSError("network unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(CheckpointError, match=rf"cache {tmp_path}: the snapshot is not there, and downloading it "
                                              r"failed: OSError: network unreachable"):
        resolve_model("tiny-org/Elsewhere", download_dir=str(tmp_path))


def test_tokenizer_option_takes_a_hub_name(offline_cache):
    own = LLM("ouro-tiny", **TINY).tokenizer
    llm = LLM("ouro-tiny", tokenizer=REPO, **TINY)
    assert llm.tokenizer.encode("héllo") == own.encode("héllo")
    with pytest.raises(ConfigError, match=r"tokenizer 'tiny-org/Nope' is not a directory.*HF_HUB_OFFLINE"):
        LLM("ouro-tiny", tokenizer="tiny-org/Nope", **TINY)


@pytest.mark.parametrize("name", ["revision", "download_dir"])
def test_hub_options_are_checked(name):
    from rlt_runtime import EngineConfig

    for bad in ("", 5):
        with pytest.raises(ConfigError, match=f"{name} must be None or a non-empty string"):
            EngineConfig.from_kwargs(**{name: bad}).validate_static()
