"""The ``vllm.general_plugins`` entry point: vLLM calls :func:`register` in every process.

Nothing is patched at import time. ``register()`` is safe to call repeatedly; it checks the
installed vLLM against the supported series (refusing to start on any other), then applies the
platform and engine patches; the worker patches follow when the process builds a vLLM worker
(see ``patches/__init__.py``). Each is inert for engines that do not use MTAD, except the named
fixes of vLLM bugs.
"""

from __future__ import annotations

from vllm_mtad.version import __version__, check_vllm_version
from vllm_mtad.log import get_logger

logger = get_logger(__name__)
_registered = False


def register() -> None:
    global _registered
    import vllm

    check_vllm_version(vllm.__version__)
    if _registered:
        return
    from vllm_mtad.patches import apply_plugin_load_patches

    apply_plugin_load_patches()
    _registered = True
    logger.debug("vllm-mtad %s registered with vLLM %s", __version__, vllm.__version__)
