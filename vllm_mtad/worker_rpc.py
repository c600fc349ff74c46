"""The hooks a benchmark or a test calls on every worker: the functions it hands to
``LLM.collective_rpc(...)``, which runs them in each worker process with the worker as their
first argument and returns their results, one per worker.

None of them is a setting of the plugin: a served engine never calls them. They read counters
(the drafter's, the sampler's, the policy's, the phase timers', the CPU k-selection's) or switch,
on one engine, what a comparison needs (a forced schedule of (W, γ), a bound on γ, a baseline's
acceptance rule, the CPU k-selection). The state they read and set stays where it lives (the
drafter, the policy's controller, the sampler, :mod:`vllm_mtad.timing`,
patches/worker/patch_topk_topp_sampler.py); each function imports it when called, so this
module imports neither vLLM nor the glue, and nothing in the package imports this module.

    llm.collective_rpc(drafter_stats)[0]            # a function taking the worker: pass it
    llm.collective_rpc(force_plans([(4, 4)]))       # a factory: pass what it returns
    llm.collective_rpc(use_selection, args=(True,))
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_mtad.sampler import FlyRule


# ---- counters ----

def drafter_stats(worker) -> dict:
    """For ``LLM.collective_rpc(drafter_stats)``: the MTAD drafter's counters on a worker."""
    from vllm_mtad.proposer import MTADProposer

    drafter = getattr(worker.model_runner, "drafter", None)
    if not isinstance(drafter, MTADProposer):
        return {}
    sampler = getattr(worker.model_runner, "rejection_sampler", None)
    scratch = drafter.scratch
    return (dict(drafter.stats) | {k: int(v) for k, v in drafter._device_stats.items()}
            | {"draft_scratch_bytes": scratch.bytes if scratch else 0,
               "draft_scratch_blocks": scratch.blocks if scratch else 0,
               "draft_scratch_rows": scratch.rows if scratch else 0}
            | {"sampler_" + k: v for k, v in getattr(sampler, "stats", {}).items()}
            | {"sampler_draft_store_misses": int(getattr(sampler, "store_misses", 0))}
            | _bonus_counters(sampler)
            | drafter.speculation.snapshot())


def _bonus_counters(sampler) -> dict:
    """How the rejection sampler's bonus draws applied top-k/top-p: by k-selection or by
    vLLM's own call (vllm_mtad.sampler.SelectingTopKTopP; absent where vLLM's is used)."""
    topk_topp = getattr(getattr(sampler, "bonus_sampler", None), "topk_topp_sampler", None)
    if not hasattr(topk_topp, "selected"):
        return {}
    return {"sampler_bonus_selected": topk_topp.selected,
            "sampler_bonus_fallbacks": topk_topp.fallbacks}


def phase_times(worker=None, reset: bool = False) -> dict:
    """For ``LLM.collective_rpc(phase_times)``: this process's counters (and optionally reset)."""
    from vllm_mtad.timing import TIMERS

    out = TIMERS.snapshot() | {"enabled": TIMERS.enabled}
    if reset:
        TIMERS.reset()
    return out


def reset_phase_times(worker=None) -> None:
    """For ``LLM.collective_rpc(reset_phase_times)``: this process's phase counters to zero."""
    from vllm_mtad.timing import TIMERS

    TIMERS.reset()


def counts(worker=None) -> dict:
    """For ``LLM.collective_rpc(counts)``: the worker's counts so far."""
    from vllm_mtad.patches.worker.patch_topk_topp_sampler import COUNTS

    return dict(COUNTS)


# ---- switches ----

def force_plans(plans):
    """For ``LLM.collective_rpc(force_plans(...))``: every MTAD runner cycles through ``plans``
    ([(W, γ), ...]; None: back to the policy) from its next step, from the cycle's start. The
    policy's step count goes on, so its exploration schedule is the one a server's engine
    follows (#force-plans-keep-step-count)."""
    def apply(worker):
        from vllm_mtad.policy.controller import of_worker

        speculation = of_worker(worker)
        if speculation is not None:
            speculation.forced = None if plans is None else [tuple(p) for p in plans]
            speculation._forced_step = 0
    return apply


def limit_plans(max_tokens: int | None):
    """For ``LLM.collective_rpc(limit_plans(n))``: every MTAD runner's adaptive policy chooses
    γ ≤ n from its next step (None: up to num_speculative_tokens again); a benchmark's way to
    compare draft-length bounds on one engine."""
    def apply(worker):
        from vllm_mtad.policy.batch import Bounds
        from vllm_mtad.policy.controller import of_worker

        speculation = of_worker(worker)
        if speculation is not None:
            G = speculation.cfg.num_speculative_tokens
            top = G if max_tokens is None else max(0, min(int(max_tokens), G))
            b = speculation.bounds
            speculation.bounds = Bounds(b.beam_width, top, b.min_beam_width,
                                        min(speculation.cfg.min_speculative_tokens, top))
    return apply


def use_baseline_rule(rule: FlyRule | None):
    """For ``LLM.collective_rpc(use_baseline_rule(FlyRule()))``: an MTAD engine verifies its
    drafts by FLy's rule (arXiv 2511.22972) instead of MTAD's, from its next step (None: MTAD's
    again). A benchmark's baseline on the same drafts and costs as MTAD W=1's: force one beam
    (force_plans); greedy requests ask for "exact" (the draft's argmax chain, as vLLM's greedy
    draft), sampled ones draft one sampled chain, as vLLM's probabilistic draft. Not a setting
    of the plugin."""
    def apply(worker):
        from vllm_mtad.request_state import DraftDistributions
        from vllm_mtad.sampler import MTADRejectionSampler

        sampler = getattr(getattr(worker, "model_runner", None), "rejection_sampler", None)
        if isinstance(sampler, MTADRejectionSampler):
            sampler.baseline_rule = rule
            # FLy's residual reads the draft's distributions: the drafter keeps them meanwhile.
            sampler.state.distributions = None if rule is None else DraftDistributions()
    return apply


def use_selection(worker, on: bool) -> dict:
    """For ``LLM.collective_rpc(use_selection, args=(on,))``: turn the selection on or off in a
    worker's process (the environment variable the patch reads at every call; the worker
    processes of a multi-process engine have their own copy), and return the worker's counts
    so far."""
    os.environ["VLLM_MTAD_CPU_TOPK_SELECT"] = "1" if on else "0"
    return counts(worker)
