"""A step-cost model of speculative decoding: tokens per second from tokens per target pass and
what a step's forwards cost, for this CPU (costs fitted from measured steps) and for a GPU (a
stated model, swept). No vLLM, no torch.

A drafting step of B requests with W beams and γ draft tokens runs one target pass over
B·(γ + 1) tokens, the draft's first pass over B rows and γ − 1 beam steps over B·W rows; it
yields B · (tokens per pass) tokens. vLLM SD and FLy draft one chain (W = 1); the target alone
runs one pass over B tokens per token. Host work beside the forwards (scheduling, the
acceptance rule, MTAD's beam bookkeeping) is not a term of its own: on this CPU it falls into
the fitted intercepts, on a GPU it is assumed hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class StepCosts:
    """Seconds (or any unit) of a target pass over n tokens and of a draft forward over n
    rows."""

    target: Callable[[float], float]
    draft: Callable[[float], float]


def step_seconds(costs: StepCosts, batch: int, width: int, gamma: int) -> float:
    """One step's forwards: the target alone (γ = 0) or a drafting step."""
    if gamma == 0:
        return costs.target(batch)
    return (costs.target(batch * (gamma + 1)) + costs.draft(batch)
            + (gamma - 1) * costs.draft(batch * width))


def tokens_per_second(costs: StepCosts, batch: int, width: int, gamma: int,
                      tokens_per_pass: float) -> float:
    return batch * tokens_per_pass / step_seconds(costs, batch, width, gamma)


def gpu_costs(draft_fraction: float, flat_tokens: int = 512, free_rows: int = 64) -> StepCosts:
    """The GPU projection's stated model, in units of one target pass: a target pass costs 1 up
    to ``flat_tokens`` tokens (memory-bound decoding: the weights are read once however many
    tokens ride along) and grows in proportion beyond; a draft forward costs
    ``draft_fraction`` of a target pass up to ``free_rows`` rows (beam rows free up to
    B·W ≤ 64) and grows in proportion beyond."""
    return StepCosts(target=lambda n: max(1.0, n / flat_tokens),
                     draft=lambda n: draft_fraction * max(1.0, n / free_rows))


def linear_costs(target: tuple[float, float], draft: tuple[float, float]) -> StepCosts:
    """(intercept, per token or row) lines, as fitted to this CPU's measured steps."""
    return StepCosts(target=lambda n: target[0] + target[1] * n,
                     draft=lambda n: draft[0] + draft[1] * n)


def fit_linear_costs(steps: Sequence[tuple[int, int, int, float]]) -> StepCosts:
    """Least-squares (intercept, slope) lines for the target pass and the draft forward from
    measured drafting steps: (batch, width, gamma, seconds per step) each, where
    seconds ≈ a_T + b_T·B(γ+1) + γ·a_D + b_D·(B + (γ−1)·B·W). Coefficients clipped at 0
    (a negative cost is noise)."""
    import numpy as np

    rows = [[1.0, b * (g + 1), g, b + (g - 1) * b * w] for b, w, g, _ in steps]
    y = [s for *_, s in steps]
    if len(rows) < 4:
        raise ValueError(f"fitting 4 coefficients needs >= 4 measured steps, got {len(rows)}")
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(y), rcond=None)
    a_t, b_t, a_d, b_d = (max(float(c), 0.0) for c in coef)
    return linear_costs((a_t, b_t), (a_d, b_d))
