"""The engine configuration vLLM builds from an MTAD setup (EngineArgs.create_engine_config on
the tiny pair; no model is loaded): vLLM's ``--spec-method/--spec-model/--spec-tokens`` flags
give the same engine as ``--speculative-config``; the parallel layouts MTAD never ran under
(context, data and pipeline parallelism > 1: everything but tensor parallelism),
vLLM's FLy verification keys, bad MTAD settings and a draft with another vocabulary are refused
naming the key, as LLM() and ``vllm serve`` refuse them before building an engine.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.engine_utils import engine_config, mtad_spec

pytestmark = pytest.mark.unit


def _engine_config(**kwargs):
    from vllm.engine.arg_utils import EngineArgs

    from vllm_mtad import plugin

    plugin.register()
    return EngineArgs(max_model_len=256, **kwargs).create_engine_config()


def _summary(cfg) -> tuple:
    spec = cfg.speculative_config
    return (spec.method, spec.model, spec.num_speculative_tokens, cfg.additional_config["mtad"])


def test_spec_flags_give_the_same_engine_as_the_speculative_config(tiny_pair_dirs):
    target, draft = map(str, tiny_pair_dirs)
    by_dict = _engine_config(model=target, speculative_config={
        "method": "mtad", "model": draft, "num_speculative_tokens": 3, "beam_width": 2})
    by_flags = _engine_config(model=target, spec_method="mtad", spec_model=draft,
                              spec_tokens=3, speculative_config={"beam_width": 2})
    assert _summary(by_flags) == _summary(by_dict)
    assert _summary(by_dict) == ("draft_model", draft, 3, {
        "num_speculative_tokens": 3, "beam_width": 2, "acceptance_threshold": 0.5,
        "greedy_acceptance": "joint", "speculation_policy": "adaptive", "min_beam_width": 1,
        "min_speculative_tokens": 0, "beam_kv_fraction": 0.1})


def test_spec_flag_and_the_same_key_in_the_dict_are_refused(tiny_pair_dirs):
    target, draft = map(str, tiny_pair_dirs)
    with pytest.raises(ValueError, match=r"--spec-model and --speculative-config\['model'\] "
                                         "are mutually exclusive"):
        _engine_config(model=target, spec_method="mtad", spec_model=draft, spec_tokens=3,
                       speculative_config={"model": draft})


def test_serve_command_line_accepts_spec_method_mtad(tiny_pair_dirs):
    """The parser ``vllm serve`` builds (AsyncEngineArgs.add_cli_args loads the plugins first)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    target, draft = map(str, tiny_pair_dirs)
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args([
        "--model", target, "--max-model-len", "256", "--spec-method", "mtad", "--spec-model",
        draft, "--spec-tokens", "2", "--speculative-config", json.dumps({"beam_width": 3})])
    cfg = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    assert _summary(cfg)[:3] == ("draft_model", draft, 2)
    assert cfg.additional_config["mtad"]["beam_width"] == 3
    # vLLM's own methods are still choices, and an unknown one is still refused by argparse.
    parser.parse_args(["--spec-method", "draft_model"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--spec-method", "mtda"])


# What every refused parallel layout's message points to instead (vllm_mtad.config).
INSTEAD = (r"Use tensor parallelism \(--tensor-parallel-size\) or one MTAD engine per replica "
           r"\(python -m vllm_mtad\.ray_batch")


@pytest.mark.parametrize("key", ["decode_context_parallel_size",
                                 "prefill_context_parallel_size"])
def test_context_parallelism_is_refused(tiny_pair_dirs, key):
    from devtools.engine import mtad_spec

    target, draft = tiny_pair_dirs
    with pytest.raises(ValueError, match=rf"MTAD does not support {key}=2.*Allowed: {key}=1") \
            as err:
        _engine_config(model=str(target), speculative_config=mtad_spec(draft),
                       tensor_parallel_size=2, **{key: 2})
    assert err.match(INSTEAD)


def _moe_target(target_dir, tmp_path):
    """The tiny target's tokenizer with a tiny Mixtral config (config only: nothing loads)."""
    moe = tmp_path / "moe-target"
    shutil.copytree(target_dir, moe)
    config = json.loads((moe / "config.json").read_text())
    config.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                  num_local_experts=4, num_experts_per_tok=2)
    (moe / "config.json").write_text(json.dumps(config))
    return moe


@pytest.mark.parametrize("width", [1, 4])
def test_data_parallelism_is_refused_for_an_moe_target(tiny_pair_dirs, tmp_path, width):
    from devtools.engine import mtad_spec

    target, draft = tiny_pair_dirs
    moe = _moe_target(target, tmp_path)
    with pytest.raises(ValueError, match=r"MTAD does not support data_parallel_size=2 with a "
                                         "mixture-of-experts target") as err:
        _engine_config(model=str(moe), speculative_config=mtad_spec(draft, width=width),
                       data_parallel_size=2)
    assert "Allowed: data_parallel_size=1" in str(err.value)
    assert err.match(INSTEAD)
    # The same MoE target without data parallelism passes MTAD's checks.
    cfg = _engine_config(model=str(moe), speculative_config=mtad_spec(draft))
    assert cfg.model_config.is_moe and "mtad" in cfg.additional_config


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
@pytest.mark.parametrize("width", [1, 4])
def test_data_parallelism_is_refused_for_a_dense_target(tiny_pair_dirs, width, policy):
    """vLLM 0.32 itself accepts --data-parallel-size 2 with a dense target and a draft model
    (each rank an independent engine under ``vllm serve``), for any W; MTAD never ran there, so
    it stops startup naming the key and what to use instead. W = 1 too: the adaptive policy's
    γ is still each engine's own, and nothing about DP was run with W = 1 either."""
    from devtools.engine import mtad_spec

    target, draft = tiny_pair_dirs
    spec = mtad_spec(draft, width=width, speculation_policy=policy)
    with pytest.raises(ValueError, match=r"MTAD does not support data_parallel_size=2 "
                                         r"\(--data-parallel-size\)") as err:
        _engine_config(model=str(target), speculative_config=spec, data_parallel_size=2)
    assert "Allowed: data_parallel_size=1" in str(err.value)
    assert err.match(INSTEAD)
    # With tensor parallelism as well, still refused (the DP check does not depend on TP).
    with pytest.raises(ValueError, match=r"data_parallel_size=2 \(--data-parallel-size\)"):
        _engine_config(model=str(target), speculative_config=spec, data_parallel_size=2,
                       tensor_parallel_size=2)
    # Tensor parallelism, what the message points to, passes MTAD's checks.
    cfg = _engine_config(model=str(target), speculative_config=spec, tensor_parallel_size=2)
    assert cfg.parallel_config.tensor_parallel_size == 2
    assert cfg.additional_config["mtad"]["beam_width"] == width


def test_pipeline_parallelism_is_refused(tiny_pair_dirs):
    """vLLM 0.32 accepts --pipeline-parallel-size 2 with a draft model (it puts the draft on
    the last stage); MTAD never ran there."""
    from devtools.engine import mtad_spec

    target, draft = tiny_pair_dirs
    with pytest.raises(ValueError, match=r"MTAD does not support pipeline_parallel_size=2 "
                                         r"\(--pipeline-parallel-size\)") as err:
        _engine_config(model=str(target), speculative_config=mtad_spec(draft),
                       pipeline_parallel_size=2)
    assert "Allowed: pipeline_parallel_size=1" in str(err.value)
    assert err.match(INSTEAD)


def test_parallel_refusals_through_the_serve_command_line(tiny_pair_dirs):
    """``vllm serve --data-parallel-size 2`` / ``--pipeline-parallel-size 2``: the same
    refusals through the parser ``vllm serve`` builds, before any engine process starts."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    target, draft = map(str, tiny_pair_dirs)
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    for flag, key in (("--data-parallel-size", "data_parallel_size"),
                      ("--pipeline-parallel-size", "pipeline_parallel_size")):
        args = parser.parse_args([
            "--model", target, "--max-model-len", "256", "--spec-method", "mtad",
            "--spec-model", draft, "--spec-tokens", "2", flag, "2"])
        with pytest.raises(ValueError, match=rf"MTAD does not support {key}=2 \({flag}\)"):
            AsyncEngineArgs.from_cli_args(args).create_engine_config()


@pytest.mark.parametrize("how", ["dict", "flags"])
def test_fly_verification_keys_stop_startup_naming_the_key(how):
    """vLLM 0.33's FLy keys with method "mtad", through the method every front end builds the
    speculative config with (EngineArgs.create_speculative_config, patched): MTAD's error
    naming the key, before vLLM sees the dict (on 0.32, vLLM's own error would be a pydantic
    "Unexpected keyword argument" that says nothing about MTAD). Pure Python: no model is
    read, so the model paths need not exist."""
    from types import SimpleNamespace

    from vllm.engine.arg_utils import EngineArgs

    from vllm_mtad import plugin

    plugin.register()
    draft = "/nonexistent/draft"
    if how == "dict":
        args = EngineArgs(model="/nonexistent/target", speculative_config={
            "method": "mtad", "model": draft, "num_speculative_tokens": 3,
            "fly_window_size": 2})
        key = "fly_window_size"
    else:
        args = EngineArgs(model="/nonexistent/target", spec_method="mtad", spec_model=draft,
                          spec_tokens=3, speculative_config={"rejection_sample_method": "fly"})
        key = "rejection_sample_method"
    with pytest.raises(ValueError) as err:
        args.create_speculative_config(None, SimpleNamespace())
    assert f"speculative config key {key!r} does not apply to method 'mtad'" in str(err.value)
    assert "MTAD has its own acceptance" in str(err.value)


# Bad settings that stop LLM() before an engine exists, through the same engine arguments
# (tests.engine_utils.engine_config: LLM()'s first step, without the rest).
@pytest.mark.parametrize("change,key", [
    ({"beam_width": 0}, "beam_width"),
    ({"acceptance_threshold": 0.0}, "acceptance_threshold"),
    ({"acceptance_threshold": 1.5}, "acceptance_threshold"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"greedy_acceptance": "fast"}, "greedy_acceptance"),
    ({"draft_sample_method": "probabilistic"}, "draft_sample_method"),
    ({"beam_width": 64}, "beam_width"),  # 64 x 8 rows > max_num_batched_tokens = 256
])
def test_bad_config_fails_at_startup_naming_the_key(tiny_pair_dirs, change, key):
    target_dir, draft_dir = tiny_pair_dirs
    spec = {**mtad_spec(draft_dir), **change}
    with pytest.raises(Exception) as err:  # LLM(...) fails here, before it builds an engine
        engine_config(target_dir, spec, max_num_batched_tokens=256)
    assert key in str(err.value), str(err.value)


def test_draft_with_another_vocabulary_is_refused(tiny_pair_dirs, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, draft_dir = tiny_pair_dirs
    draft = AutoModelForCausalLM.from_pretrained(draft_dir)
    draft.resize_token_embeddings(draft.config.vocab_size + 64)
    draft.save_pretrained(tmp_path / "draft")
    AutoTokenizer.from_pretrained(draft_dir).save_pretrained(tmp_path / "draft")
    with pytest.raises(Exception, match="vocabulary size"):
        engine_config(target_dir, mtad_spec(tmp_path / "draft"))
