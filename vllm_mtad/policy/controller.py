"""The policy's side of one MTAD engine: it times the steps, counts acceptance, and chooses
(W, γ) for each step's drafts.

One :class:`SpeculationController` per MTAD runner, made where the runner is patched
(patches/worker/patch_gpu_model_runner.py) and handed to the drafter (which asks it for each
step's plan and times its parts) and to the rejection sampler (which reports what it verified
and accepted). What it reads of the requests comes from the request state
(:meth:`vllm_mtad.request_state.MTADRequestState.demand`), per step, as a
:class:`~vllm_mtad.policy.batch.RowDemand`.
"""

from __future__ import annotations

from collections import Counter

import torch

from vllm_mtad.config import MTADConfig
from vllm_mtad.log import get_logger
from vllm_mtad.policy import choice
from vllm_mtad.policy.batch import Batch, Bounds, Plan, batch_beams, prefill_tokens
from vllm_mtad.policy.cost import CostModel
from vllm_mtad.policy.histogram import AcceptanceHistogram
from vllm_mtad.policy.stats import new_stats, summary
from vllm_mtad.policy.clock import StepTimings

logger = get_logger(__name__)

LOG_EVERY_STEPS = 2000


class SpeculationController:
    """The policy's engine-wide state: cost lines, acceptance statistics, the plans chosen."""

    def __init__(self, cfg: MTADConfig, device: torch.device):
        self.cfg = cfg
        self.adaptive = cfg.speculation_policy == "adaptive"
        G, W = cfg.num_speculative_tokens, cfg.beam_width
        self.bounds = Bounds(W, G, cfg.min_beam_width, cfg.min_speculative_tokens)
        self.costs = CostModel()
        self.stats = new_stats(W, G)
        self.timings = StepTimings(self.costs, device, enabled=self.adaptive)
        self.histogram = AcceptanceHistogram(W, G, device)
        self.stats_period = 8 if device.type == "cuda" else 1  # steps between host reads
        self.steps = 0
        self._read_step = 0  # the step of the last read of the acceptance counts
        self.chosen: Counter = Counter()  # "W{w}_g{g}" -> steps
        self.explored = 0
        self.explore_budget = choice.ExplorationBudget()
        self.catch_up_tokens = 0
        self._step_start = None
        self._last_end = None
        self._last_batch = 0
        self._verified_drafts = 0  # draft tokens the current step's target input holds
        self.prefill_tokens = 0  # prefill tokens in the current step's target input
        # A cycle of (W, γ) to use instead of the policy's choice, for tests and benchmarks
        # that need a known schedule (worker_rpc.force_plans); ``_forced_step``: its next entry.
        self.forced: list[tuple[int, int]] | None = None
        self._forced_step = 0
        # Per class, the requests that drafted the longest length, until the cold start has
        # as many as it needs (#cold-start-spans-requests).
        self._long_request_ids: dict[str, set] = {}
        # The last decision's arm, if its step can be timed whole: (its Ratio, the lines'
        # price, the decision's mark) (#step-price-measured-per-arm).
        self._arm_sample = None

    # --- timing ---------------------------------------------------------------------------
    def on_step_start(self) -> None:
        """The runner began preparing a step's inputs: the previous step's rest ends here."""
        if not self.adaptive:
            return
        self._verified_drafts = 0
        now = self.timings.mark()
        if self._last_end is not None:
            self.timings.add(self.costs.rest, self._last_batch, self._last_end, now)
            self._last_end = None
        self._step_start = now

    def stopwatch(self):
        """A context manager timing consecutive parts of a drafting step (StepTimings)."""
        return self.timings.stopwatch()

    def drafting_done(self, batch_size: int) -> None:
        if self.adaptive:
            self._last_end = self.timings.mark()
            self._last_batch = batch_size

    def verifying(self, num_draft_tokens: int) -> None:
        """The sampler's report: this step's target input holds ``num_draft_tokens`` drafts
        (vLLM's host count, SpecDecodeMetadata.num_draft_tokens summed)."""
        self._verified_drafts = num_draft_tokens

    def record_acceptance(self, classes: list[str], widths: list[int], drafted: torch.Tensor,
                          prefix_accepted: torch.Tensor) -> None:
        """The sampler's report of the rows it verified (AcceptanceHistogram.record)."""
        self.histogram.record(classes, widths, drafted, prefix_accepted)

    # --- the decision ---------------------------------------------------------------------
    def plan(self, rows, scheduled_tokens: int, demand) -> Plan:
        """(W, γ) for this step's drafts; also closes the verify part of the step's timing.
        ``rows``: the step's request_state.Rows (classes; ``fixed``: a row asked for the fixed
        policy, so the step drafts the configured plan). ``demand``: called for the rows'
        RowDemand when the adaptive policy prices the step."""
        self._close_verify(len(rows.classes), scheduled_tokens)
        self._close_arm_sample(len(rows.classes))
        self.steps += 1
        if self.adaptive:  # timings are taken under forced plans too: fit them as they come
            self.timings.resolve()
        if self.forced and not rows.fixed:
            w, g = self.forced[self._forced_step % len(self.forced)]
            self._forced_step += 1
            plan = Plan(batch_beams(rows.classes, w), g)
        elif self.adaptive and not rows.fixed:
            plan = self._choose(demand(), scheduled_tokens)
        else:
            plan = Plan(batch_beams(rows.classes, self.cfg.beam_width),
                        self.cfg.num_speculative_tokens)
        if self.adaptive and not self.forced:
            plan = _same_on_every_rank(plan)
        self._count(plan)
        if plan.num_tokens == self.cfg.num_speculative_tokens:
            self._count_long_requests(rows)
        return plan

    def _count_long_requests(self, rows) -> None:
        """Each class's distinct requests in steps drafting the longest length, into its
        statistics' ``long_requests``, up to what the cold start asks for."""
        need = choice.Tuning().min_requests
        for cls, req_id in zip(rows.classes, rows.req_ids):
            s = self.stats[cls]
            if s.long_requests < need:
                seen = self._long_request_ids.setdefault(cls, set())
                seen.add(req_id)
                s.long_requests = len(seen)
                if s.long_requests >= need:
                    del self._long_request_ids[cls]

    def _close_verify(self, num_rows: int, scheduled_tokens: int) -> None:
        """The verify part's sample; a step that verified no drafts and read no prompt is also
        a sample of what not drafting costs."""
        prefill = prefill_tokens(num_rows, scheduled_tokens, self._verified_drafts)
        self.prefill_tokens = prefill  # the drafter's first-pass sample splits on it
        if self._step_start is not None:
            self.timings.add(self.costs.verify, (scheduled_tokens - prefill, prefill),
                             self._step_start,
                             no_draft=self._verified_drafts == 0 and prefill == 0)
            self._step_start = None

    def _choose(self, demand, scheduled_tokens: int) -> Plan:
        if self.steps % self.stats_period == 0:
            self._read_acceptance()
        batch = Batch.from_step(demand, scheduled_tokens, self._verified_drafts,
                                horizon=self.bounds.max_tokens)
        plan = choice.choose(batch, self.costs, self.stats, self.bounds, self.steps,
                             budget=self.explore_budget.seconds)
        self.explore_budget.after(plan)
        self._open_arm_sample(batch, plan)
        return plan

    def _open_arm_sample(self, batch: Batch, plan: Plan) -> None:
        """Time the chosen arm's step whole, from this decision to the next, where nothing
        else shares it: a decode step (no prefill chunk, nothing to catch up, no row that
        drafts fewer tokens than the plan's)."""
        w, g = plan.beam_width, plan.num_tokens
        if g > 0 and batch.other_tokens == 0 and batch.catch_up_tokens == 0 and not batch.short:
            self._arm_sample = (self.costs.arm_ratio(batch.size, w, g),
                                self.costs.line_time(batch, w, g), (batch.size, g),
                                self.timings.mark())

    def _close_arm_sample(self, num_rows: int) -> None:
        """The last decision's arm sample, if the step that verified its drafts verified them
        all, read no prompt and kept the same rows."""
        sample, self._arm_sample = self._arm_sample, None
        if sample is None:
            return
        ratio, predicted, (rows, g), start = sample
        if num_rows == rows and self.prefill_tokens == 0 and self._verified_drafts == rows * g:
            self.timings.add_ratio(ratio, predicted, start, self.timings.mark())

    def _read_acceptance(self) -> None:
        """The sampler's counts since the last read into the statistics, with the steps they
        span (a length no draft reached ages by them, #stale-lengths-age)."""
        self.histogram.read_into(self.stats, max(1, self.steps - self._read_step))
        self._read_step = self.steps

    def _count(self, plan: Plan) -> None:
        self.chosen[f"W{plan.beam_width}_g{plan.num_tokens}"] += 1
        self.explored += plan.explore
        if self.adaptive and self.steps % LOG_EVERY_STEPS == 0:
            logger.info("MTAD adaptive speculation, %d steps: chosen %s; E[accepted] %s",
                        self.steps, dict(self.chosen.most_common(6)), summary(self.stats))

    def snapshot(self) -> dict:
        """Counters for worker_rpc.drafter_stats and the benchmarks."""
        self.timings.resolve()
        self._read_acceptance()
        coeffs = {name: [round(c, 6) for c in getattr(self.costs, name).coefficients()]
                  for name in ("verify", "first_pass", "beam_step", "rest")}
        # per batch size: measured / predicted seconds of steps without a draft, and how many
        coeffs["no_draft"] = {b: [round(r.value, 4), r.samples]
                              for b, r in sorted(self.costs.no_draft.items()) if r.samples}
        # per (B, W, γ): measured / the lines' seconds of drafting steps, and how many
        coeffs["arms"] = {f"B{b}_W{w}_g{g}": [round(r.value, 4), r.samples]
                          for (b, w, g), r in sorted(self.costs.arms.items()) if r.samples}
        drafts, accepted = self.histogram.verified()
        return {"policy": self.cfg.speculation_policy, "policy_steps": self.steps,
                "verified_drafts": drafts, "accepted_tokens": accepted,
                "policy_chosen": dict(self.chosen), "policy_explored": self.explored,
                "policy_catch_up_tokens": self.catch_up_tokens,
                "policy_costs": coeffs, "policy_acceptance": summary(self.stats)}


def _same_on_every_rank(plan: Plan) -> Plan:
    """The first tensor-parallel rank's plan, on every rank: each rank times its own steps, so
    their cost lines differ a little, and drafts of different shapes on different ranks would
    corrupt the engine. Two integers over the TP group's CPU group (gloo): no device sync."""
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return plan
    tp = parallel_state.get_tp_group()
    if tp.world_size == 1:
        return plan
    choice_t = torch.tensor([plan.beam_width, plan.num_tokens], dtype=torch.int64)
    torch.distributed.broadcast(choice_t, src=tp.first_rank, group=tp.cpu_group)
    w, g = choice_t.tolist()
    return Plan(w, g, plan.explore, plan.goodput)


def of_worker(worker) -> SpeculationController | None:
    """A vLLM worker's MTAD speculation state (None for runners without MTAD)."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    return getattr(drafter, "speculation", None)
