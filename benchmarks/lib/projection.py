"""A step-cost model of speculative decoding: tokens per second from tokens per target pass and
what a step's forwards cost, for this CPU (costs fitted from measured steps) and for a GPU (a
stated model, swept). No vLLM, no torch.

A drafting step of B requests with W beams and γ draft tokens runs one target pass over
B·(γ + 1) tokens, the draft's first pass over B rows and γ − 1 beam steps over B·W rows; it
yields B · (tokens per pass) tokens. vLLM SD and FLy draft one chain (W = 1); the target alone
runs one pass over B tokens per token. Host work beside the forwards (scheduling, the
acceptance rule, MTAD's beam bookkeeping) is not a term of its own: on this CPU it falls into
the fitted intercepts, on a GPU it is assumed hidden. One exception on the CPU: vLLM SD's
full-vocabulary work at T > 0, which the MTAD engine's steps do not hold, is priced per row
from a phase profile (``sd_vocab_row_seconds``).
"""

from __future__ import annotations

import statistics
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


# ---- vLLM SD's own work at T > 0, measured by benchmarks.phases step ----

OWN_FORWARDS = ("target_forward", "draft_forward")


def vocab_rows(batch: int, gamma: int) -> int:
    """Full-vocabulary rows vLLM SD works over in one T > 0 step: it draws each of the γ draft
    tokens from the draft's whole distribution (B rows a draft step) and its rejection sampler
    takes the target's and the draft's probabilities over B·(γ + 1) rows. The MTAD engine (FLy
    and MTAD alike) works on the k-selection's candidates instead."""
    return batch * (2 * gamma + 1)


def sd_vocab_row_seconds(profiles: Sequence[dict]) -> dict:
    """What vLLM SD's own work (every phase but the two forwards) costs at T > 0 beyond the MTAD
    engine's, per full-vocabulary row (``vocab_rows``), from benchmarks.phases step's JSON: one
    value per pair of runs with the same repeat (one engine each), then their median. Seconds.

    The cost model's lines are fitted to the MTAD engine's steps, so they hold that engine's own
    work; this is what vLLM SD does beyond it, measured phase by phase rather than fitted to the
    ratios the model predicts. Each profile must be at T > 0 with one chain (W = 1)."""
    pairs = []
    for prof in profiles:
        args = prof["args"]
        cell = str(args.get("cell"))
        if args.get("width") != 1 or not cell.startswith("T=") or cell.startswith("T=0"):
            raise ValueError(f"a T > 0, one-chain profile is needed, got cell "
                             f"{args.get('cell')!r} width {args.get('width')!r}")
        rows = vocab_rows(int(args["batch"]), int(args["gamma"]))
        own: dict = {}
        for run in prof["runs"]:
            ms = run["ms_per_step"]
            own.setdefault(run["repeat"], {})[run["engine"]] = (
                ms["whole_step"] - sum(ms[k] for k in OWN_FORWARDS))
        for repeat, by in sorted(own.items()):
            if {"vllm_sd", "mtad"} <= by.keys():
                pairs.append(dict(batch=int(args["batch"]), gamma=int(args["gamma"]),
                                  repeat=repeat, sd_ms=by["vllm_sd"], mtad_ms=by["mtad"],
                                  per_row_s=(by["vllm_sd"] - by["mtad"]) / 1e3 / rows))
    if not pairs:
        raise ValueError("no profile has a vLLM SD run and an MTAD run of the same repeat")
    per_row = [p["per_row_s"] for p in pairs]
    return dict(per_row_s=statistics.median(per_row), range=[min(per_row), max(per_row)],
                pairs=pairs)


# ---- a GPU projection from measured parts (benchmarks.forwards, benchmarks.kernels core) ----

def t0_tokens_per_pass(acceptance: dict) -> dict[str, float]:
    """Mean tokens per target pass over the prompt sets of every fixed (W, γ) configuration at
    T=0 in benchmarks.acceptance's JSON ("config | prompt set" -> {"pooled": ...}); the
    adaptive policy's rows and greedy "exact" MTAD left out."""
    values: dict[str, list[float]] = {}
    for key, row in acceptance["rows"].items():
        config = key.split(" | ")[0]
        if ("policy_chosen" not in row and config.endswith(" T0")
                and not config.startswith("mtad_exact")):
            values.setdefault(config, []).append(row["pooled"])
    return {c: sum(v) / len(v) for c, v in values.items()}


def interpolate(points: dict[float, float], x: float) -> float:
    """Piecewise-linear through ``points`` (x -> y), extended by the end segments."""
    xs = sorted(points)
    if x in points:
        return points[x]
    if len(xs) == 1:
        return points[xs[0]]
    lo, hi = (xs[0], xs[1]) if x < xs[0] else (xs[-2], xs[-1]) if x > xs[-1] else next(
        (a, b) for a, b in zip(xs, xs[1:]) if a <= x <= b)
    return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)


def forwards_mode(forwards: dict) -> str:
    """The forwards a projection uses from benchmarks.forwards' JSON: "compiled" where it
    measured them (closer to vLLM's fused kernels), else "plain"."""
    modes = {r["mode"] for r in forwards["rows"] if "ms" in r}
    return "compiled" if "compiled" in modes else "plain"


@dataclass(frozen=True)
class MeasuredParts:
    """Milliseconds measured on one GPU: the target's pass over (requests, tokens each), the
    draft's forward over rows, MTAD's beam step over rows and MTAD's acceptance over
    (requests, γ)."""

    target: dict  # (requests, tokens each) -> ms
    draft: dict  # rows -> ms
    beam_step: dict  # γ -> {rows -> ms}
    acceptance: dict  # γ -> {requests -> ms}

    @classmethod
    def from_reports(cls, forwards: dict, core: dict, mode: str | None = None
                     ) -> "MeasuredParts":
        """From benchmarks.forwards' JSON (its ``mode`` rows; by default "compiled" where it
        has them, else "plain") and benchmarks.kernels core's (its graph replays)."""
        mode = mode or forwards_mode(forwards)
        rows = [r for r in forwards["rows"] if r["mode"] == mode and "ms" in r]
        beam: dict = {}
        accept: dict = {}
        for r in core["rows"]:
            if "graph_us" not in r:
                continue
            if r["piece"].startswith("beam step"):  # by rows (B·W), whatever the split
                beam.setdefault(r["gamma"], {}).setdefault(r["rows"], []).append(r["graph_us"])
            elif r["piece"] == "MTAD acceptance":
                accept.setdefault(r["gamma"], {}).setdefault(r["batch"], []).append(
                    r["graph_us"])

        def ms(by):  # γ -> {x -> mean ms}
            return {g: {x: sum(v) / len(v) / 1e3 for x, v in pts.items()} for g, pts in by.items()}

        return cls(target={(r["batch"], r["tokens_each"]): r["ms"] for r in rows
                           if r["model"] == "target"},
                   draft={r["batch"]: r["ms"] for r in rows if r["model"] == "draft"},
                   beam_step=ms(beam), acceptance=ms(accept))

    def step_ms(self, batch: int, width: int, gamma: int, mtad: bool) -> float:
        """One step of B requests: the target alone (γ = 0), or a target pass over γ + 1 tokens
        each, the draft's first pass over B rows and γ − 1 forwards over B·W rows; MTAD also
        pays a beam step per draft token (the first over the first pass's B rows, the others
        over B·W) and its acceptance. (vLLM SD and FLy are charged nothing beside their
        forwards.) The target pass must have been measured at exactly (B, γ + 1); the other
        parts are interpolated."""
        if gamma == 0:
            return self.target[(batch, 1)]
        ms = (self.target[(batch, gamma + 1)] + interpolate(self.draft, batch)
              + (gamma - 1) * interpolate(self.draft, batch * width))
        if mtad:
            beam = self.beam_step[gamma]
            ms += (interpolate(beam, batch) + (gamma - 1) * interpolate(beam, batch * width)
                   + interpolate(self.acceptance[gamma], batch))
        return ms


def measured_projection(tokens_per_pass: dict[str, float], parts: MeasuredParts,
                        batches=(1, 4, 16)) -> list[dict]:
    """Per T=0 configuration ("vllm_sd_greedy g4 T0", "fly g8 T0", "mtad w4 g8 T0", ...) and
    batch: step ms, and tokens per second over the target alone and over vLLM SD at the same γ."""
    out = []
    for config, tpp in tokens_per_pass.items():
        parts_of = config.split(" ")
        g = int(parts_of[-2][1:])
        mtad = parts_of[0] == "mtad"
        w = int(parts_of[1][1:]) if mtad else 1
        sd = tokens_per_pass.get(f"vllm_sd_greedy g{g} T0")
        if sd is None:
            continue
        row = dict(config=config, w=w, g=g, tokens_per_pass=tpp)
        for b in batches:
            step = parts.step_ms(b, w, g, mtad)
            speed = b * tpp / step
            row[f"step ms b{b}"] = step
            row[f"vs target b{b}"] = speed / (b / parts.step_ms(b, 1, 0, False))
            row[f"vs SD b{b}"] = speed / (b * sd / parts.step_ms(b, 1, g, False))
            # MTAD's beam steps and acceptance left out: what its forwards alone would give
            row[f"vs SD b{b}, forwards only"] = (b * tpp / parts.step_ms(b, w, g, False)) / (
                b * sd / parts.step_ms(b, 1, g, False))
        out.append(row)
    return out
