"""The ``vllm.general_plugins`` entry point: vLLM calls :func:`register` in every process.

Nothing is patched at import time. ``register()`` is safe to call repeatedly; it checks the
installed vLLM and the platform it runs on against the supported (series, platform) pairs
(refusing to start on any other: a CPU build of a CUDA-only series is refused), then applies the
platform and engine patches; the worker patches follow when the process builds a vLLM worker
(see ``patches/__init__.py``). Each is inert for engines that do not use MTAD, except the named
fixes of vLLM bugs and the opt-in top-k/top-p selection (VLLM_MTAD_CPU_TOPK_SELECT=1).
"""

from __future__ import annotations

from vllm_mtad.version import __version__, check_vllm_version
from vllm_mtad.log import get_logger

logger = get_logger(__name__)
# Module-level state: register() ran in this process (vLLM calls it once per process, and
# again in some; patching twice would fail).
_registered = False


def vllm_platform() -> str:
    """"cpu" or "cuda", else vLLM's name for the platform it found (which the version check
    refuses). Read from vLLM's ``current_platform``: resolved once per process, without
    initialising CUDA (vLLM's detection asks NVML), and read at plugin load by
    patches/platform/patch_cpu_triton_utils.py anyway. It is what vLLM will run on, also where
    the distribution's name would mislead (the ``vllm`` wheel with VLLM_TARGET_DEVICE=cpu)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_cuda():
        return "cuda"
    return getattr(current_platform, "device_name", "") or "an unspecified platform"


def register() -> None:
    global _registered
    import vllm

    check_vllm_version(vllm.__version__, vllm_platform())
    if _registered:
        return
    from vllm_mtad.patches import apply_plugin_load_patches

    apply_plugin_load_patches()
    _registered = True
    logger.debug("vllm-mtad %s registered with vLLM %s", __version__, vllm.__version__)
