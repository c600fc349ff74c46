"""The speculation policy: which beam width W and draft length γ each step drafts.

- :mod:`~vllm_mtad.policy.cost`: what a step costs (cost lines fitted online);
- :mod:`~vllm_mtad.policy.stats`: how much the target accepts (per class, W and length);
- :mod:`~vllm_mtad.policy.batch`: the step's batch, the bounds, the plan, who drafts one beam;
- :mod:`~vllm_mtad.policy.choice`: the choice (expected goodput, exploration);
- :mod:`~vllm_mtad.policy.clock`, :mod:`~vllm_mtad.policy.histogram`: the measurements;
- :mod:`~vllm_mtad.policy.controller`: the engine's side (one per MTAD runner);

cost, stats, batch and choice import neither vLLM nor torch. The evidence behind each rule is
in docs/policy-decisions.md.
"""

from vllm_mtad.policy.batch import (Batch, Bounds, Plan, RowDemand, batch_beams,
                                    prefill_tokens, row_beams)
from vllm_mtad.policy.choice import (EXPLORE_SHARE, ExplorationBudget, Tuning, arms, choose,
                                     expected_tokens, exploration_cost, goodput)
from vllm_mtad.policy.cost import CostModel, LinearCost, Ratio
from vllm_mtad.policy.stats import CLASSES, AcceptanceStats, new_stats, summary

__all__ = ["CLASSES", "EXPLORE_SHARE", "AcceptanceStats", "Batch", "Bounds", "CostModel",
           "ExplorationBudget", "LinearCost", "Plan", "Ratio", "RowDemand", "Tuning", "arms",
           "batch_beams", "choose", "expected_tokens", "exploration_cost", "goodput",
           "new_stats", "prefill_tokens", "row_beams", "summary"]
