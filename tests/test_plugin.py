"""Registration and the vLLM version gate."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from vllm_mtad import version

pytestmark = pytest.mark.patches


def test_parse_release():
    assert version.parse_release("0.32.0+cpu") == (0, 32, 0)
    assert version.parse_release("0.32.1rc2") == (0, 32, 1)
    assert version.parse_release("dev") == ()


def test_unsupported_version_is_refused_naming_both_versions():
    version.check_vllm_version("0.32.0+cpu")
    version.check_vllm_version("0.32.3")
    for bad in ("0.31.2", "0.33.0", "1.0.0", "unknown"):
        with pytest.raises(version.UnsupportedVLLMVersionError) as err:
            version.check_vllm_version(bad)
        assert bad in str(err.value) and "0.32" in str(err.value)


def test_entry_point_is_declared_and_register_is_idempotent():
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "mtad"]
    assert len(eps) == 1 and eps[0].value == "vllm_mtad.plugin:register"
    register = eps[0].load()
    register()
    register()


def test_register_refuses_an_unsupported_vllm(monkeypatch):
    import vllm

    from vllm_mtad import plugin

    monkeypatch.setattr(vllm, "__version__", "0.31.0")
    with pytest.raises(version.UnsupportedVLLMVersionError, match="found vLLM 0.31.0"):
        plugin.register()
