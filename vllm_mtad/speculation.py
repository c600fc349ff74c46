"""Per-engine speculation state: what the policy measures, what it chose, and which requests'
draft KV is behind.

One :class:`SpeculationController` per MTAD runner, created by the drafter and handed to the
rejection sampler (patches/worker/patch_gpu_model_runner.py). It holds the engine-wide part:

- the cost models and acceptance statistics of :mod:`vllm_mtad.core.policy`, fed by
  :class:`StepClock` timings of each step's parts and by a device histogram of accepted
  lengths that the sampler fills (read on the host every ``stats_period`` steps);
- counters of the (W, γ) chosen, for ``drafter_stats`` and the periodic log line.

The per-request part (the requests' settings, which requests skipped draft steps so that their
draft KV catches up when they next draft, the beams of each request's latest draft) is in
:class:`vllm_mtad.request_state.MTADRequestState`.

Timing: on CPU, ``time.perf_counter``; on CUDA, events recorded on the stream and read one
step later (no host sync). Step parts: *verify* (from the runner's input preparation to the
drafter: the target's forward and the sampler) by tokens scheduled, *first pass* (the draft's
catch-up and first pass) by tokens read, *beam step* (one draft step of B·W rows, vocabulary
work included) by rows, and the *rest* (bookkeeping, scheduling) by requests.
"""

from __future__ import annotations

import time
from collections import Counter

import torch

from vllm_mtad.config import MTADConfig
from vllm_mtad.core import policy
from vllm_mtad.log import get_logger
# DraftKVTracker and request_seed: per-request, defined with the request state.
from vllm_mtad.request_state import DraftKVTracker, MTADRequestState, request_seed  # noqa: F401

logger = get_logger(__name__)

CLASS_INDEX = {c: i for i, c in enumerate(policy.CLASSES)}
LOG_EVERY_STEPS = 2000


class StepClock:
    """Time marks that cost no host sync: floats on CPU, CUDA events on a GPU (read once they
    have completed, i.e. a step later)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float | None:
        """Seconds between two marks, or None while a CUDA event has not completed."""
        if not self.cuda:
            return end - start
        if not (start.query() and end.query()):
            return None
        return start.elapsed_time(end) / 1e3


class SpeculationController:
    """The policy's engine-wide state (cost models, acceptance statistics, chosen plans); the
    per-request bookkeeping it reads (where each request's draft KV stops, the beams of its
    latest draft) is in ``requests``, the runner's :class:`MTADRequestState`."""

    def __init__(self, cfg: MTADConfig, device: torch.device,
                 requests: MTADRequestState | None = None):
        self.cfg = cfg
        self.requests = MTADRequestState(cfg) if requests is None else requests
        self.adaptive = cfg.speculation_policy == "adaptive"
        G, W = cfg.num_speculative_tokens, cfg.beam_width
        self.bounds = policy.Bounds(W, G, cfg.min_beam_width, cfg.min_speculative_tokens)
        self.costs = policy.CostModel()
        self.stats = policy.new_stats(W, G)
        self.clock = StepClock(device)
        self.device = device
        self.steps = 0
        self._forced_step = 0  # the next entry of ``forced``
        self.chosen: Counter = Counter()  # "W{w}_g{g}" -> steps
        self.explored = 0
        self.explore_budget = policy.ExplorationBudget()
        self.catch_up_tokens = 0
        # [classes, W, γ+1 length, γ+1 accepted, 2] counts, filled on the device by the sampler:
        # every verified draft (last index 1) and each of its shorter prefixes (0), with what
        # the rule accepted of those tokens alone (AcceptanceStats counts each length's own).
        self._hist = torch.zeros(len(policy.CLASSES) * W * (G + 1) * (G + 1) * 2,
                                 dtype=torch.int64, device=device)
        self._hist_read = [0] * self._hist.numel()
        self.stats_period = 8 if device.type == "cuda" else 1
        # (cost model, size, start mark, end mark, parts, a step verifying no drafts)
        self._pending: list = []
        self._step_start = None
        self._last_end = None
        self._last_batch = 0
        self._verified_drafts = 0  # draft tokens the current step's target input holds
        self.prefill_tokens = 0  # prefill tokens in the current step's target input
        # A cycle of (W, γ) to use instead of the policy's choice: for tests and benchmarks that
        # need a known schedule (set with force_plans()).
        self.forced: list[tuple[int, int]] | None = None

    # --- timing ---------------------------------------------------------------------------
    def on_step_start(self) -> None:
        """The runner began preparing a step's inputs."""
        if not self.adaptive:
            return
        self._verified_drafts = 0
        now = self.clock.mark()
        if self._last_end is not None:
            self._pending.append((self.costs.rest, self._last_batch, self._last_end, now, 1,
                                  False))
            self._last_end = None
        self._step_start = now

    def mark(self):
        return self.clock.mark() if self.adaptive else None

    def time_part(self, model: policy.LinearCost, size, start, end=None,
                  count: int = 1, no_draft: bool = False) -> None:
        """One sample of ``model`` at ``size`` (a number, or a tuple for a line of several
        sizes; ``count`` equal parts between the marks: seconds/count). ``no_draft``: a
        verification of decode tokens only, without drafts: also a sample of
        CostModel.no_draft at its size, measured against the verify line's price before it is
        added."""
        if start is None:  # not timing (fixed policy)
            return
        end = end if end is not None else self.clock.mark()
        self._pending.append((model, size, start, end, count, no_draft))

    def drafting_done(self, batch_size: int) -> None:
        if not self.adaptive:
            return
        self._last_end = self.clock.mark()
        self._last_batch = batch_size

    def _resolve(self) -> None:
        keep = []
        for item in self._pending:
            model, size, start, end, count, no_draft = item
            seconds = self.clock.seconds(start, end)
            if seconds is None:
                keep.append(item)
                continue
            seconds /= count
            if model is self.costs.rest and model.samples >= 8 and (
                    seconds > 5 * model.predict(size) + 1e-3):  # the engine idled in between
                continue
            if no_draft and model.samples >= 8:
                self.costs.no_draft_ratio(size[0]).add(seconds, model.predict(size))
            model.add(size, model.clip(size, seconds))
        self._pending = keep

    def verifying(self, num_draft_tokens: int) -> None:
        """The sampler's report: this step's target input holds ``num_draft_tokens`` drafts
        (vLLM's host count, SpecDecodeMetadata.num_draft_tokens summed)."""
        self._verified_drafts = num_draft_tokens

    # --- acceptance -----------------------------------------------------------------------
    def record_acceptance(self, classes: list[str], widths: list[int], drafted: torch.Tensor,
                          prefix_accepted: torch.Tensor) -> None:
        """Count each row's verified draft. Device tensors: ``drafted`` [B], each row's draft
        length; ``prefix_accepted`` [B, γ], column g-1 the tokens accepted of the draft's first
        g tokens alone (AcceptanceResult.prefix_accepted; the last column is the row's k*)."""
        G, W = self.cfg.num_speculative_tokens, self.cfg.beam_width
        B, gamma = prefix_accepted.shape
        if B == 0 or gamma == 0:
            return
        base = torch.tensor([(CLASS_INDEX[c] * W + min(w, W) - 1) * (G + 1) * (G + 1) * 2
                             for c, w in zip(classes, widths)], dtype=torch.int64)
        base = base.to(self.device, non_blocking=True)
        lengths = torch.arange(1, gamma + 1, device=self.device)
        drafted = drafted.to(torch.int64).clamp(0, G)[:, None]
        idx = (base[:, None] + lengths * (G + 1) * 2 + prefix_accepted.clamp(0, G) * 2
               + (lengths == drafted).to(torch.int64))
        self._hist.index_add_(0, idx.reshape(-1), (lengths <= drafted).to(torch.int64).reshape(-1))

    def _cells(self, counts: list):
        """((class, width, length, accepted, real), count) of the histogram's nonzero cells."""
        G, W = self.cfg.num_speculative_tokens, self.cfg.beam_width
        for i, n in enumerate(counts):
            if n:
                real, rest = i % 2, i // 2
                accepted, rest = rest % (G + 1), rest // (G + 1)
                length, rest = rest % (G + 1), rest // (G + 1)
                yield (policy.CLASSES[rest // W], rest % W + 1, length, accepted, real), n

    def _read_acceptance(self) -> None:
        now = self._hist.tolist()
        # class -> width -> ([(drafted, accepted, count)], [prefixes: (length, accepted, count)])
        by_class: dict = {}
        for (cls, width, length, accepted, real), n in self._cells(
                [a - b for a, b in zip(now, self._hist_read)]):
            window = by_class.setdefault(cls, {}).setdefault(width, ([], []))
            window[1 - real].append((length, accepted, n))
        for cls, by_width in by_class.items():
            self.stats[cls].record_window(by_width)
        self._hist_read = now

    def verified(self) -> tuple[int, int]:
        """(drafts verified, draft tokens accepted) since start, from the sampler's counts."""
        drafts = accepted = 0
        for (_, _, length, k, real), n in self._cells(self._hist_read):
            if real and length > 0:
                drafts += n
                accepted += n * k
        return drafts, accepted

    # --- the decision ---------------------------------------------------------------------
    def plan(self, classes: list[str], scheduled_tokens: int, req_ids=(), starts=(),
             requests=None, fixed: bool = False) -> policy.Plan:
        """(W, γ) for this step's drafts; also closes the verify part of the step's timing.
        ``req_ids``, ``starts`` (their computed tokens) and ``requests`` (the runner's) say
        what the draft owes from steps without drafting and how long the requests have left
        to run, over which the policy spreads what the draft owes. ``fixed``: a request in the
        step asked for the fixed policy, so the step drafts the configured (W, γ)."""
        prefill = policy.prefill_tokens(len(classes), scheduled_tokens, self._verified_drafts)
        self.prefill_tokens = prefill  # the proposer's first-pass sample splits on it
        if self._step_start is not None:
            # A step that verified no drafts and read no prompt: what not drafting costs.
            self.time_part(self.costs.verify, (scheduled_tokens - prefill, prefill),
                           self._step_start,
                           no_draft=self._verified_drafts == 0 and prefill == 0)
            self._step_start = None
        self.steps += 1
        only_exact = all(c == "exact" for c in classes)  # they draft the argmax chain
        if self.adaptive:  # timings are taken under forced plans too: fit them as they come
            self._resolve()
        if self.forced and not fixed:
            w, g = self.forced[self._forced_step % len(self.forced)]
            self._forced_step += 1
            plan = policy.Plan(1 if only_exact else w, g)
        elif self.adaptive and not fixed:
            if self.steps % self.stats_period == 0:
                self._read_acceptance()
            kv = self.requests.kv
            owed = kv.owed(req_ids, starts) if kv.skipped_any else {}
            left, prompts, budgets, arriving = [], [], [], 0
            if requests is not None:
                for r, start in zip(req_ids, starts):
                    req, start = requests[r], int(start)
                    left.append(_tokens_left(req))
                    # No budget known (vLLM always sets one for generation): no prompt price.
                    budgets.append(getattr(req.sampling_params, "max_tokens", None)
                                   or float("inf"))
                    # The prompt tokens the draft reads (a prefix-cache hit's are cached).
                    prompts.append(max(0, req.num_prompt_tokens - kv.read_from(r, start)))
                    if r in owed and start < req.num_prompt_tokens:
                        # An arrival (its prompt is still being read): its catch-up is all
                        # prompt, priced by the prompts' rate; an earlier arrival's is a debt.
                        arriving += owed[r]
            batch = policy.Batch.from_step(
                classes, scheduled_tokens, self._verified_drafts, sum(owed.values()),
                tokens_left=left, horizon=self.bounds.max_tokens, prompt_tokens=prompts,
                max_tokens=budgets, catch_up_arrival_tokens=arriving)
            plan = policy.choose(batch, self.costs, self.stats, self.bounds, self.steps,
                                 budget=self.explore_budget.seconds)
            self.explore_budget.after(plan)
        else:
            plan = policy.Plan(1 if only_exact else self.cfg.beam_width,
                               self.cfg.num_speculative_tokens)
        if self.adaptive and not self.forced:
            plan = _same_on_every_rank(plan)
        self.chosen[f"W{plan.beam_width}_g{plan.num_tokens}"] += 1
        self.explored += plan.explore
        if self.adaptive and self.steps % LOG_EVERY_STEPS == 0:
            logger.info("MTAD adaptive speculation, %d steps: chosen %s; E[accepted] %s",
                        self.steps, dict(self.chosen.most_common(6)),
                        policy.summary(self.stats))
        return plan

    def snapshot(self) -> dict:
        """Counters for drafter_stats() and the benchmarks."""
        self._resolve()
        self._read_acceptance()
        coeffs = {name: [round(c, 6) for c in m.coefficients()]
                  for name, m in (("verify", self.costs.verify),
                                  ("first_pass", self.costs.first_pass),
                                  ("beam_step", self.costs.beam_step),
                                  ("rest", self.costs.rest))}
        # per batch size: measured / predicted seconds of steps without a draft, and how many
        coeffs["no_draft"] = {b: [round(r.value, 4), r.samples]
                              for b, r in sorted(self.costs.no_draft.items()) if r.samples}
        drafts, accepted = self.verified()
        return {"policy": self.cfg.speculation_policy, "policy_steps": self.steps,
                "verified_drafts": drafts, "accepted_tokens": accepted,
                "policy_chosen": dict(self.chosen), "policy_explored": self.explored,
                "policy_catch_up_tokens": self.catch_up_tokens,
                "policy_costs": coeffs, "policy_acceptance": policy.summary(self.stats)}


def _tokens_left(request) -> int:
    """Output tokens a request may still generate (vLLM's CachedRequestState)."""
    max_tokens = getattr(request.sampling_params, "max_tokens", None) or 0
    return max(1, max_tokens - len(request.output_token_ids))


def _same_on_every_rank(plan: policy.Plan) -> policy.Plan:
    """The first tensor-parallel rank's plan, on every rank. Each rank times its own steps, so
    their cost models differ a little; drafts of different shapes on different ranks would
    corrupt the engine. Two integers over the TP group's CPU group (gloo): no device sync."""
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return plan
    tp = parallel_state.get_tp_group()
    if tp.world_size == 1:
        return plan
    choice = torch.tensor([plan.beam_width, plan.num_tokens], dtype=torch.int64)
    torch.distributed.broadcast(choice, src=tp.first_rank, group=tp.cpu_group)
    w, g = choice.tolist()
    return policy.Plan(w, g, plan.explore, plan.goodput)


def of_worker(worker) -> SpeculationController | None:
    """A vLLM worker's MTAD speculation state (None for runners without MTAD)."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    return getattr(drafter, "speculation", None)


def force_plans(plans):
    """For ``LLM.collective_rpc(force_plans(...))``: make every MTAD runner cycle through
    ``plans`` ([(W, γ), ...]; None: back to the policy) from its next step, from the cycle's
    start. The policy's step count goes on: its exploration schedule (policy.choose: one step
    in explore_period, a cycle's arm and the optimistic arm in turn) is the one a server's
    engine follows.
    (Reset here, it restarted at every benchmark run, and runs of ~50 steps at batch 1 never
    reached its fourth arm: W = beam_width, γ = max; measured in grid b1fc3b7.)"""
    def apply(worker):
        speculation = of_worker(worker)
        if speculation is not None:
            speculation.forced = None if plans is None else [tuple(p) for p in plans]
            speculation._forced_step = 0
    return apply


def limit_plans(max_tokens: int | None):
    """For ``LLM.collective_rpc(limit_plans(n))``: every MTAD runner's adaptive policy chooses
    γ ≤ n from its next step (None: up to num_speculative_tokens again). A benchmark's way to
    compare draft-length bounds on one engine, which then shares its measurements."""
    def apply(worker):
        speculation = of_worker(worker)
        if speculation is not None:
            G = speculation.cfg.num_speculative_tokens
            top = G if max_tokens is None else max(0, min(int(max_tokens), G))
            b = speculation.bounds
            speculation.bounds = policy.Bounds(b.beam_width, top, b.min_beam_width,
                                               min(speculation.cfg.min_speculative_tokens, top))
    return apply
