"""Choosing W and γ per step: the arm of highest expected goodput, with some exploration.

Goodput (SmartSpec, arXiv 2406.14066) is the expected number of tokens a step produces over
the expected time the step takes. For a batch of B requests drafting γ tokens with W beams:

    tokens(W, γ) = Σ_rows 1 + E[accepted | row's class, row's W, min(γ, row's tokens left − 1)]
    time(W, γ)   = verify(n_verify) + [γ > 0]·(first_pass(n_first) + (γ − 1)·beam_step(B·W)
                   + prompts · tokens(W, γ) + owed / steps left)

with n_verify = B·(1 + γ) (prefill chunks, verified alike by every arm, left out), n_first the
step's decode tokens, ``prompts`` the draft's reading of prompts per output token
(#prompts-are-a-rate) and ``owed`` what it skipped in steps without drafting
(#skipped-prompts-are-a-debt). Costs are :mod:`vllm_mtad.policy.cost` lines, acceptance
:mod:`vllm_mtad.policy.stats` counts, both measured on this engine: nothing here knows the
machine. γ = 0: no draft forward this step; each request gets one token from the target.

No vLLM, no torch. Why each rule: docs/policy-decisions.md (anchors named below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_mtad.policy.batch import Batch, Bounds, Plan, batch_beams, row_beams
from vllm_mtad.policy.cost import CostModel

# Exploration spends at most this share of the time (ExplorationBudget).
EXPLORE_SHARE = 0.02


@dataclass(frozen=True)
class Tuning:
    """How :func:`choose` explores: one step in ``explore_period``; the configured arm until
    every cost line has ``min_samples`` and each of the batch's classes has had ``min_drafts``
    drafts of the longest arm (#cold-start-measures-the-long-arm), made by ``min_requests``
    requests (#cold-start-spans-requests); arms' tokens priced
    ``confidence`` standard errors below their estimate, and the optimistic exploration's
    at least sqrt(2 ln step) above it (#optimism-grows-with-steps); the step without a draft
    explored first, where the budget allows, until ``min_no_draft`` steps of the batch size
    have measured it."""

    explore_period: int = 16
    min_samples: int = 8
    confidence: float = 1.0
    min_no_draft: int = 3
    min_drafts: int = 16
    min_requests: int = 4


def expected_tokens(batch: Batch, stats: dict, width: int, num_tokens: int,
                    confidence: float = 0.0) -> float:
    """Σ over rows of 1 + E[accepted] (``confidence``: AcceptanceStats.expected_accepted's);
    a short row's draft counts up to its tokens left − 1."""
    total = 0.0
    short = {}
    for (cls, left), n in batch.short:
        short[cls] = short.get(cls, 0) + n
        total += n * _row_tokens(stats, cls, width, min(num_tokens, max(left - 1, 0)),
                                 confidence)
    for cls, n in batch.rows.items():
        n -= short.get(cls, 0)
        if n > 0:
            total += n * _row_tokens(stats, cls, width, num_tokens, confidence)
    return total


def _row_tokens(stats: dict, cls: str, width: int, num_tokens: int,
                confidence: float = 0.0) -> float:
    if num_tokens <= 0:
        return 1.0
    # A greedy row's one-token draft is its argmax whatever W: priced as one beam's
    # (#one-beam-pricing).
    beams = 1 if cls == "joint" and num_tokens == 1 else row_beams(cls, width)
    return 1.0 + stats[cls].expected_accepted(beams, num_tokens, confidence)


def goodput(batch: Batch, costs: CostModel, stats: dict, width: int, num_tokens: int,
            amortise: bool = True, confidence: float = 0.0) -> float:
    """Expected tokens per second of the step (W, γ) = (width, num_tokens). What the draft owes
    is charged over the steps the requests have left at this arm's rate (``amortise``), or in
    full (what an exploration step pays). ``confidence``: tokens priced that many standard
    errors below their estimate."""
    tokens = expected_tokens(batch, stats, width, num_tokens, confidence)
    share = 1.0
    if amortise:
        share = 1.0 / max(1.0, batch.remaining_tokens / max(tokens / max(batch.size, 1), 1.0))
    seconds = costs.step_time(batch, width, num_tokens, share)
    if num_tokens > 0:
        seconds += costs.prompt_time(batch, tokens)
    return tokens / max(seconds, 1e-9)


def arms(bounds: Bounds, batch: Batch) -> list[tuple[int, int]]:
    """Every (W, γ) in bounds; one W when every row drafts one beam (W does not matter)."""
    one_beam = batch_beams(batch.classes, bounds.beam_width) == 1
    widths = [1] if one_beam else range(bounds.min_beam_width, bounds.beam_width + 1)
    return [(w, g) for w in widths for g in range(bounds.min_tokens, bounds.max_tokens + 1)
            if g > 0 or w == widths[0]]


def exploration_cost(batch: Batch, costs: CostModel, stats: dict, arm: tuple,
                     best_goodput: float) -> float:
    """Seconds an exploration step drafting ``arm`` loses against the best arm: its predicted
    time, what the draft owes paid in full, less the time the best arm takes to make the
    tokens it is expected to make; >= 0."""
    w, g = arm
    tokens = expected_tokens(batch, stats, w, g)
    seconds = costs.step_time(batch, w, g, owed_share=1.0)
    if g > 0:
        seconds += costs.prompt_time(batch, tokens)
    return max(0.0, seconds - tokens / max(best_goodput, 1e-9))


@dataclass(frozen=True)
class _Prices:
    """One decision's inputs: the batch, the cost lines, the acceptance statistics."""

    batch: Batch
    costs: CostModel
    stats: dict

    def goodput(self, arm: tuple, confidence: float = 0.0, amortise: bool = True) -> float:
        return goodput(self.batch, self.costs, self.stats, *arm, amortise=amortise,
                       confidence=confidence)

    def explorable(self, arm: tuple, owed: float) -> bool:
        """Whether an exploration step may draft ``arm`` (γ >= 1): not where what the draft
        must read first (``owed``, paid in full) costs more than the drafting step itself,
        nor where no row can take a drafted token (#explorable-arms)."""
        return (owed <= self.costs.step_time(self.batch, *arm, owed_share=0.0)
                and expected_tokens(self.batch, self.stats, *arm) > self.batch.size + 1e-9)


def choose(batch: Batch, costs: CostModel, stats: dict, bounds: Bounds, step: int,
           budget: float = float("inf"), tuning: Tuning = Tuning()) -> Plan:
    """The (W, γ) that maximises expected goodput for ``batch``, each arm's tokens priced
    ``tuning.confidence`` standard errors below their estimate (an arm measured on a few lucky
    drafts is not chosen over a well-measured one).

    Before every cost line has ``tuning.min_samples``: the configured (beam_width,
    max_tokens). Afterwards one step in ``tuning.explore_period`` explores another arm
    (:func:`_explore`), unless that costs more than ``budget`` (seconds, the caller's
    :class:`ExplorationBudget`)."""
    full_width = batch_beams(batch.classes, bounds.beam_width)
    if batch.size == 0 or not (costs.ready(tuning.min_samples, bounds.max_tokens)
                               and long_arm_measured(batch, stats, bounds, tuning)):
        return Plan(full_width, bounds.max_tokens)
    prices = _Prices(batch, costs, stats)
    best, best_goodput = None, -1.0
    for arm in arms(bounds, batch):
        value = prices.goodput(arm, confidence=tuning.confidence)
        if value > best_goodput + 1e-12:
            best, best_goodput = arm, value
    if tuning.explore_period > 0 and step % tuning.explore_period == 0:
        plan = _explore(prices, bounds, step // tuning.explore_period, (best, best_goodput),
                        budget, tuning)
        if plan is not None:
            return plan
    w, g = best
    return Plan(w, g, goodput=best_goodput,
                seconds=expected_tokens(batch, stats, w, g, tuning.confidence)
                / max(best_goodput, 1e-9))


def long_arm_measured(batch: Batch, stats: dict, bounds: Bounds, tuning: Tuning) -> bool:
    """Whether every class of ``batch`` has had ``tuning.min_drafts`` verified drafts of the
    longest length, by ``tuning.min_requests`` requests or more (#cold-start-spans-requests),
    at any width (ever: counts that do not decay; a row without room for its beams
    drafts one, so the full width alone could stay unmeasured). Those also count as drafts of
    every shorter length, so each arm's acceptance then rests on several requests' drafts
    (#cold-start-measures-the-long-arm). Bounds narrowed below the statistics' longest length
    (worker_rpc.limit_plans) ask for nothing."""
    for cls in batch.classes:
        s = stats[cls]
        if bounds.max_tokens == s.max_tokens and (sum(s.long_drafts) < tuning.min_drafts
                                                  or s.long_requests < tuning.min_requests):
            return False
    return True


def _explore(prices: _Prices, bounds: Bounds, turn: int, best: tuple, budget: float,
             tuning: Tuning) -> Plan | None:
    """The exploration step's arm, in turn (#exploration-cycle, #optimistic-arm):

    - one of a fixed cycle (W = 1 and W = beam_width at the full length, half the length, the
      shortest draft and, where the bounds allow, no draft), which keeps the cost lines
      measured at sizes the chosen arms never reach; the step without a draft first, until
      ``tuning.min_no_draft`` steps of this batch size have measured it, where the budget
      allows it (a step without a draft costs a drafting step's tokens and the draft's
      catch-up: it must not hold back every other exploration, #no-draft-first-if-affordable);
    - every other turn, the drafting arm with the best goodput priced sqrt(2 ln step) (at
      least ``confidence``) standard errors *above* its tokens (an upper confidence bound that
      grows while an arm goes unmeasured), where that beats the best arm.

    None where no arm is left or the arm costs more than ``budget`` (#exploration-budget)."""
    batch, costs, stats = prices.batch, prices.costs, prices.stats
    (w, g), best_goodput = best
    full_width = batch_beams(batch.classes, bounds.beam_width)
    half = max(bounds.min_tokens, 1, (bounds.max_tokens + 1) // 2)
    narrow = max(bounds.min_beam_width, 1)
    candidates = [(narrow, bounds.max_tokens), (full_width, bounds.max_tokens), (w, half),
                  (w, max(bounds.min_tokens, 1))]
    if full_width == 1:
        candidates = [(1, c[1]) for c in candidates]
    candidates = [c for c in dict.fromkeys(candidates) if c != (w, g)]
    # No draft: the draft skips one step (its KV catches up on the next drafting step).
    skip = [(min(full_width, narrow), 0)] if bounds.min_tokens == 0 and g > 0 else []
    owed = costs.reading_time(batch)
    candidates = [c for c in candidates if prices.explorable(c, owed)]
    skip_first = False
    if skip and costs.no_draft_ratio(batch.size).samples < tuning.min_no_draft:
        # first, where affordable; else the other arms take the turn
        skip_first = exploration_cost(batch, costs, stats, skip[0], best_goodput) <= budget
        candidates = skip if skip_first else candidates
    else:
        candidates += skip
    if not skip_first and turn % 2 == 0:
        step = turn * max(tuning.explore_period, 1)
        optimism = max(tuning.confidence, math.sqrt(2.0 * math.log(max(step, 2))))
        pick = _optimistic_arm(prices, bounds, best, optimism, owed)
        if pick is not None:
            candidates = [pick]
    if not candidates:
        return None
    ew, eg = candidates[(turn // 2) % len(candidates)]
    cost = exploration_cost(batch, costs, stats, (ew, eg), best_goodput)
    if cost > budget:
        return None
    value = prices.goodput((ew, eg), amortise=False)
    return Plan(ew, eg, explore=True, goodput=value,
                seconds=expected_tokens(batch, stats, ew, eg) / max(value, 1e-9), cost=cost)


def _optimistic_arm(prices: _Prices, bounds: Bounds, best: tuple, confidence: float,
                    owed: float):
    """The drafting arm other than the best with the highest goodput priced ``confidence``
    standard errors above its expected tokens, if that beats the best's goodput (else None);
    arms an exploration may not draft are left out."""
    (best_arm, bound), pick = best, None
    for c in arms(bounds, prices.batch):
        if c == best_arm or c[1] == 0 or not prices.explorable(c, owed):
            continue
        value = prices.goodput(c, confidence=-confidence)
        if value > bound + 1e-12:
            bound, pick = value, c
    return pick


@dataclass
class ExplorationBudget:
    """Seconds an exploration step may cost against the best arm: each step adds ``share`` of
    its predicted time, an exploration pays its cost, and the balance decays by 1/``horizon``
    a step. So exploration costs at most ``share`` of the time by the policy's own prices,
    whatever the arms cost on this machine (#exploration-budget)."""

    share: float = EXPLORE_SHARE
    horizon: float = 512.0
    seconds: float = 0.0

    def after(self, plan: Plan) -> None:
        self.seconds = self.seconds * (1.0 - 1.0 / self.horizon) + self.share * plan.seconds
        if plan.explore:
            self.seconds = max(0.0, self.seconds - plan.cost)
