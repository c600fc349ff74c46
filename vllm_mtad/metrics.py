"""The speculation policy's choices on ``/metrics``: steps drafted per (W, γ).

vLLM's ``vllm:spec_decode_*`` counters say how many drafts were verified and accepted, not how
many beams drafted them or how long the policy made them. The choice is made in the worker
(:class:`vllm_mtad.policy.controller.SpeculationController`), far from the front end's Prometheus
registry; it travels the way vLLM's own spec-decode counts travel:

1. the worker hangs the drafter's running counts (``{"W4_g4": steps, ...}``, every step since
   the engine started, never a delta) on the step's ``ModelRunnerOutput`` (:func:`attach`,
   from patches/worker/patch_gpu_worker.py);
2. the scheduler copies the latest counts it received into the step's ``SchedulerStats``
   (patches/engine/patch_scheduler.py), which carries them to the front end in a field
   patches/engine/patch_metrics_stats.py adds;
3. :class:`vllm_mtad.stat_logger.MTADStatLogger`, a ``vllm.stat_logger_plugins`` entry point
   (setup.py), turns the counts into
   ``vllm:mtad_policy_steps_total{beam_width, num_speculative_tokens}``.

Running counts, not deltas: an output that never reaches the front end (an empty step, stats
sent to another front end) loses nothing, and the logger takes the differences. A step is
counted once, when the worker chooses its plan; ``num_speculative_tokens="0"`` counts the steps
in which no request drafted. Offline ``LLM`` engines load no stat-logger plugins: there,
``LLM.collective_rpc(vllm_mtad.worker_rpc.drafter_stats)`` reports the same counts
(``policy_chosen``).

No vLLM import at module level: the engine patches read :data:`FIELD` at plugin load.
"""

from __future__ import annotations

import re

# The attribute of ModelRunnerOutput (worker -> scheduler) and the field of SchedulerStats
# (scheduler -> front end) that carry the running counts.
FIELD = "mtad_policy_steps"
METRIC = "vllm:mtad_policy_steps"
_KEY = re.compile(r"W(\d+)_g(\d+)")

# Module-level state: the one Prometheus counter of this process (a second engine in the same
# process reuses it; vLLM's PrometheusStatLogger unregisters every "vllm:" collector when it is
# built, so the counter is (re)registered on first use, not at import).
_counter = None


def attach(output, counts) -> None:
    """Hang the running (W, γ) counts on a worker's step output: a ModelRunnerOutput, or the
    one inside vLLM's AsyncModelRunnerOutput. vLLM's shared empty output is left alone."""
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

    inner = getattr(output, "_model_runner_output", output)
    if isinstance(inner, ModelRunnerOutput) and inner is not EMPTY_MODEL_RUNNER_OUTPUT:
        setattr(inner, FIELD, dict(counts))


def parse(key: str) -> tuple[int, int]:
    """"W4_g2" -> (4, 2)."""
    match = _KEY.fullmatch(key)
    if match is None:
        raise ValueError(f"not a policy choice: {key!r}")
    return int(match.group(1)), int(match.group(2))


def increments(previous: dict[str, int], now: dict[str, int]) -> dict[str, int]:
    """What each count gained. A count below its last value means the engine's drafter was
    rebuilt (its counts started again from zero): all of it is new."""
    out = {}
    for key, count in now.items():
        gained = count - previous.get(key, 0)
        if gained < 0:
            gained = count
        if gained:
            out[key] = gained
    return out


def counter():
    """The process's ``vllm:mtad_policy_steps`` counter, registered if it is not."""
    global _counter
    from prometheus_client import REGISTRY, Counter

    if _counter is None or _counter not in REGISTRY._collector_to_names:
        _counter = Counter(
            METRIC, "Engine steps drafted with each beam width W and draft length γ chosen by "
            "MTAD's speculation policy (γ = 0: no request drafted).",
            labelnames=["model_name", "engine", "beam_width", "num_speculative_tokens"])
    return _counter
