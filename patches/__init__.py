"""Changes to vLLM's own behaviour, one file per patched vLLM module, grouped by the process
they belong to. Installed as ``vllm_mtad.patches``; nothing patches at import time.

- ``platform/``: applied at plugin load in every process — the CPU kernel fix that vLLM's
  kernel registration must see, and the hook that applies ``worker/`` when a worker starts;
- ``engine/``: the front end and engine (configuration, request validation), applied at
  plugin load;
- ``worker/``: the model runner and worker, applied when the process builds its first vLLM
  worker (``platform/patch_worker_base.py``), so a process that builds none — the API server;
  the engine core when the workers run in their own processes (always on CPU, and with TP > 1)
  — never imports or patches the model runner.

:func:`vllm_mtad.plugin.register` is the one entry point (vLLM calls it in every process). A
group is applied once per process; each apply() returns when its target is already patched
and is inert for engines without MTAD, except the named vLLM bug fixes and the opt-in
top-k/top-p selection (worker/patch_topk_topp_sampler.py, VLLM_MTAD_CPU_TOPK_SELECT=1). Every file opens with
the same header fields (checked by tests/test_patches.py): Target, Why, How, Upstream,
Checked, Removal. docs/vllm-integration.md#registration-and-patches lists them.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os

from vllm_mtad.log import get_logger

logger = get_logger(__name__)

PLUGIN_LOAD_PATCHES = (
    "platform.patch_cpu_triton_utils",
    "platform.patch_worker_base",
    "engine.patch_arg_utils",
    "engine.patch_config_vllm",
    "engine.patch_input_processor",
    "engine.patch_metrics_stats",
    "engine.patch_scheduler",
)
WORKER_PATCHES = (
    "worker.patch_cpu_generator_rewind",
    "worker.patch_cpu_worker",
    "worker.patch_gpu_model_runner",
    "worker.patch_gpu_worker",
    "worker.patch_phase_timers",
    "worker.patch_topk_topp_sampler",
)
PATCH_MODULES = PLUGIN_LOAD_PATCHES + WORKER_PATCHES

# Module-level state: the groups applied in this process (each once per process, as patches are).
_applied: set[str] = set()


def _apply(group: str, names: tuple[str, ...]) -> None:
    if group in _applied:
        return
    for name in names:
        importlib.import_module(f"{__name__}.{name}").apply()
    _applied.add(group)
    logger.debug("vllm-mtad: %s patches applied", group)


def apply_plugin_load_patches() -> None:
    """The platform and engine groups (from register(), in every process)."""
    _apply("plugin-load", PLUGIN_LOAD_PATCHES)


def apply_worker_patches() -> None:
    """The worker group (from the WorkerBase.__init__ hook, in a process that builds a worker)."""
    if "worker" in _applied:
        return
    _apply("worker", WORKER_PATCHES)
    # One line per worker process: operators (and tests/test_serve.py) can see which processes
    # run the MTAD glue.
    logger.info("vllm-mtad: worker patches applied in %s (pid %d)",
                multiprocessing.current_process().name, os.getpid())


def applied_groups() -> frozenset[str]:
    """The groups applied in this process ("plugin-load", "worker")."""
    return frozenset(_applied)
