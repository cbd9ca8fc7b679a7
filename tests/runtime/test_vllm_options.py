"""vLLM option names (`enforce_eager`, `swap_space`, ...) in LLM(...) and the CLIs: each maps
to rlt's option or fails with a message naming the vLLM option, rlt's option and the allowed values."""

from __future__ import annotations

import pytest

from rlt_runtime import LLM, ConfigError, EngineConfig, SamplingParams
from rlt_runtime.entrypoints import bench_offline, cli
from rlt_runtime.entrypoints.engine_args import engine_kwargs
from rlt_runtime.entrypoints.server import cli as serve_cli

TINY = dict(dtype="float32", device="cpu", max_num_seqs=2, num_blocks=64, max_model_len=64)


def test_enforce_eager_maps_to_execution_mode():
    assert EngineConfig.from_kwargs(enforce_eager=True).execution_mode == "eager"
    assert EngineConfig.from_kwargs(enforce_eager=False).execution_mode is None  # the engine decides
    assert EngineConfig.from_kwargs(enforce_eager=True, execution_mode="eager").execution_mode == "eager"
    with pytest.raises(ConfigError, match=r"enforce_eager=True .* execution_mode='eager' .* execution_mode='graphs'"):
        EngineConfig.from_kwargs(enforce_eager=True, execution_mode="graphs")
    with pytest.raises(ConfigError, match="enforce_eager .* must be a boolean"):
        EngineConfig.from_kwargs(enforce_eager="yes")


def test_tensor_parallel_size_is_an_engine_option():
    assert EngineConfig.from_kwargs(tensor_parallel_size=2).tensor_parallel_size == 2
    for bad in (0, True, 1.0):
        with pytest.raises(ConfigError, match=r"tensor_parallel_size must be an integer >= 1"):
            EngineConfig.from_kwargs(tensor_parallel_size=bad).validate_static()


def test_flags_accepted_without_effect_are_type_checked():
    base = EngineConfig.from_kwargs()
    for name in ("disable_log_stats", "trust_remote_code"):
        for value in (True, False):
            assert EngineConfig.from_kwargs(**{name: value}) == base
        with pytest.raises(ConfigError, match=f"{name} .* must be a boolean, got 1"):
            EngineConfig.from_kwargs(**{name: 1})


def test_swap_space_zero_means_recompute_else_error():
    assert EngineConfig.from_kwargs(swap_space=0).preemption_mode == "recompute"
    with pytest.raises(ConfigError, match=r"swap_space \(vLLM option\) must be 0 or left out, got 4.*"
                                          r"preemption_mode='swap'.*allowed: 'recompute', 'swap'"):
        EngineConfig.from_kwargs(swap_space=4)
    with pytest.raises(ConfigError, match=r"swap_space=0 .* preemption_mode='swap' was also given"):
        EngineConfig.from_kwargs(swap_space=0, preemption_mode="swap")


def test_load_format_and_tokenizer_mode_take_what_rlt_loads():
    base = EngineConfig.from_kwargs()
    for kw in (dict(load_format="auto"), dict(load_format="safetensors"), dict(tokenizer_mode="auto")):
        assert EngineConfig.from_kwargs(**kw) == base
    with pytest.raises(ConfigError, match=r"load_format \(vLLM option\) must be 'auto' or 'safetensors' or left out, "
                                          r"got 'pt': rlt reads safetensors"):
        EngineConfig.from_kwargs(load_format="pt")
    with pytest.raises(ConfigError, match=r"tokenizer_mode \(vLLM option\) must be 'auto' or left out, got 'mistral'"):
        EngineConfig.from_kwargs(tokenizer_mode="mistral")
    args = serve_cli.build_parser().parse_args(["--model", "m", "--load-format", "safetensors", "--tokenizer-mode",
                                                 "auto"])
    assert EngineConfig.from_kwargs(**engine_kwargs(args)) == EngineConfig.from_kwargs()


def test_kv_cache_dtype_and_quantization():
    """Both are rlt options (FP8, tests/runtime/test_fp8_engine.py); other values name the allowed ones."""
    assert EngineConfig.from_kwargs(kv_cache_dtype="auto", quantization=None) == EngineConfig.from_kwargs()
    EngineConfig.from_kwargs(kv_cache_dtype="fp8", quantization="fp8").validate_static()
    EngineConfig.from_kwargs(kv_cache_dtype="fp8", quantization="w8a8_fp8").validate_static()
    with pytest.raises(ConfigError, match=r"kv_cache_dtype must be one of 'auto', 'fp8', got 'fp16'"):
        EngineConfig.from_kwargs(kv_cache_dtype="fp16").validate_static()
    with pytest.raises(ConfigError, match=r"quantization must be one of None, 'fp8', 'w8a8_fp8', got 'awq'"):
        EngineConfig.from_kwargs(quantization="awq").validate_static()


def test_llm_takes_the_vllm_names():
    llm = LLM("ouro-tiny", enforce_eager=True, tensor_parallel_size=1, disable_log_stats=True, trust_remote_code=True,
              swap_space=0, kv_cache_dtype="auto", quantization=None, **TINY)
    assert llm.engine.execution_mode == "eager" and llm.engine.cfg.preemption_mode == "recompute"
    out = llm.generate(["hi"], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 2
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=3 must divide the model's attention heads \(4\)"):
        LLM("ouro-tiny", tensor_parallel_size=3, **TINY)


def _save_tokenizer(path, vocab_size: int) -> None:
    """A word-level tokenizer.json with `vocab_size` tokens ("w0", "w1", ...; "w0" is the unknown token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))


def test_tokenizer_option_replaces_the_model_tokenizer(tmp_path):
    _save_tokenizer(tmp_path / "words", 300)
    llm = LLM("ouro-tiny", tokenizer=str(tmp_path / "words"), **TINY)
    assert llm.tokenizer.encode("w5 w299 w7", add_special_tokens=False) == [5, 299, 7]
    out = llm.generate("w5 w299 w7", SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)[0]
    assert out.prompt_token_ids == [5, 299, 7]
    own = LLM("ouro-tiny", **TINY).tokenizer.encode("w5 w299 w7", add_special_tokens=False)
    assert own != [5, 299, 7]  # the built-in byte-level tokenizer splits it otherwise


def test_tokenizer_option_errors(tmp_path):
    _save_tokenizer(tmp_path / "big", 400)
    with pytest.raises(ConfigError, match=r"tokenizer .* has 400 tokens but the model's vocabulary has 320"):
        LLM("ouro-tiny", tokenizer=str(tmp_path / "big"), **TINY)
    with pytest.raises(ConfigError, match="tokenizer must be a directory holding tokenizer.json"):
        LLM("ouro-tiny", tokenizer=str(tmp_path / "missing"), **TINY)
    with pytest.raises(ConfigError, match="tokenizer must be None or a tokenizer directory"):
        EngineConfig.from_kwargs(tokenizer="").validate_static()


VLLM_FLAGS = ["--enforce-eager", "--tensor-parallel-size", "1", "--disable-log-stats", "--trust-remote-code",
              "--swap-space", "0", "--kv-cache-dtype", "auto", "--tokenizer", "tok-dir"]
VLLM_KWARGS = {"enforce_eager": True, "tensor_parallel_size": 1, "disable_log_stats": True, "trust_remote_code": True,
               "swap_space": 0.0, "kv_cache_dtype": "auto", "tokenizer": "tok-dir"}


@pytest.mark.parametrize("parser", [cli.build_parser, serve_cli.build_parser,
                                    lambda: bench_offline._parser("rlt-bench throughput")])
def test_cli_flags_reach_the_engine_options(parser):
    args = parser().parse_args(["--model", "ouro-tiny", *VLLM_FLAGS, "--quantization", "awq"])
    options = engine_kwargs(args)
    assert options == {**VLLM_KWARGS, "quantization": "awq"}
    assert engine_kwargs(parser().parse_args(["--model", "m"])) == {}  # nothing set: nothing passed


def test_cli_errors_name_the_options(capsys):
    assert cli.main(["--model", "ouro-tiny", "--prompt", "x", "--device", "cpu", "--tensor-parallel-size", "3"]) == 2
    assert "tensor_parallel_size=3 must divide" in capsys.readouterr().err
    assert serve_cli.main(["--model", "ouro-tiny", "--kv-cache-dtype", "fp16"]) == 2  # before the port opens
    assert "kv_cache_dtype must be one of 'auto', 'fp8'" in capsys.readouterr().err
    assert bench_offline.throughput_main(["--model", "ouro-tiny", "--quantization", "gptq"]) == 2
    assert "quantization must be one of None, 'fp8'" in capsys.readouterr().err
    assert cli.main(["--model", "ouro-tiny", "--prompt", "x", "--max-tokens", "2", "--ignore-eos", "--enforce-eager",
                     "--trust-remote-code", "--swap-space", "0", *TINY_FLAGS]) == 0


TINY_FLAGS = ["--dtype", "float32", "--device", "cpu", "--num-blocks", "64", "--max-model-len", "64"]


def test_serve_takes_the_model_positionally_as_vllm_serve_does(capsys):
    for argv in (["ouro-tiny"], ["--model", "ouro-tiny"], ["ouro-tiny", "--model", "ouro-tiny"]):
        assert serve_cli.parse_args(argv).model == "ouro-tiny"
    for argv, message in (([], "give the model: rlt-serve MODEL or --model MODEL"),
                          (["a", "--model", "b"], "the model is given twice and differently: 'a' and --model 'b'")):
        with pytest.raises(SystemExit):
            serve_cli.parse_args(argv)
        assert message in capsys.readouterr().err
