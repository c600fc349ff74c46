"""MTAD's settings: the speculative config's translation, the keys refused, per-request keys."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_translate_speculative_config():
    from vllm_mtad.config import translate_speculative_config

    spec, extra = translate_speculative_config(
        {"method": "mtad", "model": "d", "num-speculative-tokens": 3, "beam_width": 2},
        {"other": 1})
    assert spec == {"method": "draft_model", "model": "d", "num_speculative_tokens": 3}
    assert extra == {"other": 1, "mtad": {"num_speculative_tokens": 3, "beam_width": 2,
                                          "acceptance_threshold": 0.5,
                                          "greedy_acceptance": "joint",
                                          "speculation_policy": "adaptive", "min_beam_width": 1,
                                          "min_speculative_tokens": 0,
                                          "beam_kv_fraction": 0.1}}
    with pytest.raises(ValueError, match="'model' is required"):
        translate_speculative_config({"method": "mtad", "num_speculative_tokens": 3}, None)
    with pytest.raises(ValueError, match="'num_speculative_tokens' is required"):
        translate_speculative_config({"method": "mtad", "model": "d"}, None)


@pytest.mark.parametrize("key,value,says", [
    ("rejection_sample_method", "fly", "FLy's lossy verification"),
    ("rejection_sample_method", "standard", "vLLM's rejection sampling"),
    ("fly_window_size", 2, "FLy's lossy verification"),
    ("fly_entropy_threshold", 0.2, "FLy's lossy verification"),
    ("fly_entropy_top_k", 3, "FLy's lossy verification"),
    ("fly-window-size", 2, "FLy's lossy verification"),  # the CLI spelling
    ("synthetic_acceptance_length", 2.5, "vLLM's rejection sampling"),
])
def test_vllm_verification_keys_are_refused_for_mtad(key, value, says):
    """vLLM 0.33's FLy (rejection_sample_method "fly", fly_*) and vLLM's other verification
    settings: MTAD accepts by its own rule, so the key is named and the fix given."""
    from vllm_mtad.config import translate_speculative_config

    spec = {"method": "mtad", "model": "d", "num_speculative_tokens": 3, key: value}
    with pytest.raises(ValueError) as err:
        translate_speculative_config(spec, None)
    message = str(err.value)
    assert f"speculative config key {key.replace('-', '_')!r}" in message
    assert "MTAD has its own acceptance" in message and says in message
    assert "acceptance_threshold" in message


def test_vllm_drafting_keys_are_refused_for_mtad():
    from vllm_mtad.config import translate_speculative_config

    for key, value in (("draft_sample_method", "probabilistic"), ("parallel_drafting", True),
                       ("use_heterogeneous_vocab", True)):
        with pytest.raises(ValueError, match=f"key '{key}' does not apply to method 'mtad'"):
            translate_speculative_config({"method": "mtad", "model": "d",
                                          "num_speculative_tokens": 3, key: value}, None)


def test_check_batch_limits_message():
    from vllm_mtad.patches.engine.patch_config_vllm import check_batch_limits

    check_batch_limits(4, 16, 64)
    with pytest.raises(ValueError, match=r"'beam_width'=8 .* beam_width <= 4"):
        check_batch_limits(8, 16, 64)


def test_request_keys_refuse_engine_wide_keys_and_typos_only():
    from vllm_mtad.config import MTADConfig, request_settings

    cfg = MTADConfig(4, 4, 0.5)
    # vLLM's own and custom logits processors' keys share extra_args: they pass.
    assert request_settings({"kv_transfer_params": {}, "my_processor_arg": 3,
                             "acceptance_threshold": 0.2}, cfg) == (0.2, "joint", False)
    for key in ("beam_width", "num_speculative_tokens"):
        with pytest.raises(ValueError, match=f"'{key}' is engine-wide.*'acceptance_threshold'"):
            request_settings({key: 2}, cfg)
    for typo, meant in (("acceptnce_threshold", "acceptance_threshold"),
                        ("greedy_acceptence", "greedy_acceptance")):
        with pytest.raises(ValueError, match=f"did you mean '{meant}'"):
            request_settings({typo: 0.3}, cfg)


def test_a_request_may_ask_for_the_fixed_policy_only_in_an_adaptive_engine():
    from vllm_mtad.config import MTADConfig, request_settings

    adaptive = MTADConfig(4, 4, 0.5)  # the default
    fixed = MTADConfig(4, 4, 0.5, speculation_policy="fixed")
    assert request_settings({"speculation_policy": "fixed"}, adaptive)[2] is True
    assert request_settings({"speculation_policy": "adaptive"}, adaptive)[2] is False
    assert request_settings({}, adaptive)[2] is False
    assert request_settings({"speculation_policy": "fixed"}, fixed)[2] is False  # fixed already
    with pytest.raises(ValueError, match="'adaptive' needs an engine started with"):
        request_settings({"speculation_policy": "adaptive"}, fixed)
    with pytest.raises(ValueError, match=r"'speculation_policy' must be one of \['fixed', "):
        request_settings({"speculation_policy": "greedy"}, adaptive)
    with pytest.raises(ValueError, match="did you mean 'speculation_policy'"):
        request_settings({"speculation_polcy": "fixed"}, adaptive)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, "0.1", True, None])
def test_beam_kv_fraction_is_checked(bad):
    from vllm_mtad.config import MTADConfig

    with pytest.raises(ValueError, match=r"'beam_kv_fraction' must be a number in \(0, 1\)"):
        MTADConfig(4, beam_kv_fraction=bad)
