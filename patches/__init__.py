"""Changes to vLLM's own behaviour, one file per patched vLLM module.

``engine/`` holds patches that matter in the front end and engine-core processes, ``worker/``
those that matter in the model-runner processes. :func:`vllm_mtad.plugin.register` applies all
of them in every process (each apply() is cheap and idempotent — it returns when its target is
already patched, while vllm_mtad.patching.patch itself refuses a second patch of an attribute —
and inert for engines without MTAD, except the named vLLM bug fixes). Installed as
``vllm_mtad.patches``; nothing patches at import time.
Every file opens with the same header fields (checked by tests/test_patches.py):
Target, Why, How, Upstream, Checked, Removal.
"""

from __future__ import annotations

import importlib

PATCH_MODULES = (
    "engine.patch_arg_utils",
    "engine.patch_config_vllm",
    "engine.patch_input_processor",
    "worker.patch_cpu_triton_utils",
    "worker.patch_cpu_worker",
    "worker.patch_gpu_model_runner",
    "worker.patch_gpu_worker",
    "worker.patch_phase_timers",
)


def apply_all() -> None:
    for name in PATCH_MODULES:
        importlib.import_module(f"{__name__}.{name}").apply()
