"""A step-cost model of speculative decoding: tokens per second from tokens per target pass and
what a step costs, for this CPU (costs fitted from measured steps), for a GPU from measured
parts (``MeasuredParts``, priced by the policy's own formula, vllm_mtad.policy.cost.step_price)
and for a GPU by a stated model (``gpu_costs``, swept). No vLLM, no torch.

A drafting step of B requests with W beams and γ draft tokens runs one target pass over
B·(γ + 1) tokens, the draft's first pass over B rows and γ − 1 beam steps over B·W rows; it
yields B · (tokens per pass) tokens. vLLM SD and FLy draft one chain (W = 1); the target alone
runs one pass over B tokens per token. On this CPU the work beside the forwards falls into the
fitted intercepts, except vLLM SD's full-vocabulary work at T > 0, which the MTAD engine's steps
do not hold, priced per row from a phase profile (``sd_vocab_row_seconds``). The GPU projection
from measured parts charges every rule its own sampling and acceptance and a host overhead per
step (``Charges``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from vllm_mtad.policy.cost import StepPrices, step_price


@dataclass(frozen=True)
class StepCosts:
    """Seconds (or any unit) of a target pass over n tokens and of a draft forward over n
    rows."""

    target: Callable[[float], float]
    draft: Callable[[float], float]


def step_seconds(costs: StepCosts, batch: int, width: int, gamma: int) -> float:
    """One step's forwards: the target alone (γ = 0) or a drafting step, by the policy's
    formula (vllm_mtad.policy.cost.step_price) with nothing beside the forwards."""
    prices = StepPrices(verify=costs.target, first_pass=costs.draft, beam_step=costs.draft,
                        rest=lambda requests: 0.0)
    return step_price(prices, batch, width, gamma, first_pass_tokens=batch)


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


# ---- a GPU projection from measured parts (benchmarks.kernels forwards and core) ----

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
    """The forwards a projection uses from benchmarks.kernels forwards' JSON: "compiled" where it
    measured them (closer to vLLM's fused kernels), else "plain"."""
    modes = {r["mode"] for r in forwards["rows"] if "ms" in r}
    return "compiled" if "compiled" in modes else "plain"


# The engines whose host overhead benchmarks.phases overhead measures (a rule runs on one).
ENGINES = ("target", "vllm_sd", "fly", "mtad_w1", "mtad_w4")


def engine_of_rule(rule: str, width: int) -> str:
    """The engine a projected rule's host overhead is read for."""
    return f"mtad_w{width}" if rule == "mtad" else rule


@dataclass(frozen=True)
class Charges:
    """What a projected step charges beside the forwards.

    ``host``: ms a step per engine (``ENGINES``; "mtad_w{W}" interpolated in W), or one value
    for every engine. ``rule_work``: each rule's own sampling and acceptance, from the core's
    GPU pieces (False: forwards only, for every rule alike). ``sd_work``: what vLLM SD's
    sampling and acceptance, never timed on the GPU, are priced as: "one_chain" (a one-chain
    draft step as the core's beam step at B rows, as FLy's, and MTAD's acceptance), "fly"
    (the same draft steps, FLy's acceptance) or "none". ``flat_verify``: the verification
    priced as a one-token pass (a kernel for which γ + 1 tokens cost what one does).
    ``eager_core``: the MTAD engine's rules (MTAD and FLy) pay the core's pieces as timed
    eager, as the engine runs them today (the graph replays assume its draft loop captured);
    vLLM SD's stay as one chain's graph replays."""

    host: float | dict = 0.0
    rule_work: bool = True
    sd_work: str = "one_chain"
    flat_verify: bool = False
    eager_core: bool = False

    def __post_init__(self) -> None:
        if self.sd_work not in ("one_chain", "fly", "none"):
            raise ValueError(f"sd_work {self.sd_work!r}: one of one_chain, fly, none")

    def host_ms(self, engine: str) -> float:
        if not isinstance(self.host, dict):
            return float(self.host)
        if engine in self.host:
            return self.host[engine]
        widths = {int(k.removeprefix("mtad_w")): v for k, v in self.host.items()
                  if k.startswith("mtad_w")}
        if engine.startswith("mtad_w") and widths:
            return interpolate(widths, int(engine.removeprefix("mtad_w")))
        raise KeyError(f"no host overhead for engine {engine!r} (have {sorted(self.host)})")


@dataclass(frozen=True)
class MeasuredParts:
    """Milliseconds measured on one GPU: the target's pass over (requests, tokens each), the
    draft's forward over rows, and the core's pieces (T=1, every row sampled, replayed from
    CUDA graphs): a beam step (processing, noise, selection) over rows, MTAD's and FLy's
    acceptance over (requests, γ)."""

    target: dict  # (requests, tokens each) -> ms
    draft: dict  # rows -> ms
    beam_step: dict  # γ -> {rows -> ms}
    acceptance: dict  # γ -> {requests -> ms}: MTAD's rule
    fly_acceptance: dict = field(default_factory=dict)  # γ -> {requests -> ms}: FLy's rule
    # The same three pieces timed eager: {"beam": ..., "MTAD acceptance": ..., "FLy ...": ...}
    eager: dict = field(default_factory=dict)

    @classmethod
    def from_reports(cls, forwards: dict, core: dict, mode: str | None = None,
                     shapes: Sequence[str] | None = None, masked: bool = True
                     ) -> "MeasuredParts":
        """From benchmarks.kernels forwards' JSON (its ``mode`` rows; by default "compiled"
        where it has them, else "plain"; only the target and draft of ``shapes`` if given;
        the verification with the causal mask or, ``masked`` False, without one where it
        was timed so) and benchmarks.kernels core's (its graph replays)."""
        mode = mode or forwards_mode(forwards)
        usable = [r for r in forwards["rows"] if r["mode"] == mode and "ms" in r
                  and (shapes is None or r.get("shape") in shapes)]

        def key(r):
            return r["model"], r.get("shape"), r["batch"], r["tokens_each"]

        # One token needs no mask; rows from before the mask was recorded were masked.
        masked_rows = [r for r in usable if r["tokens_each"] == 1
                       or r.get("attention_mask", "causal") == "causal"]
        rows = masked_rows
        if not masked:  # unmasked where timed so, else masked
            rows = {key(r): r for r in masked_rows} | {
                key(r): r for r in usable if r.get("attention_mask") == "none"}
            rows = list(rows.values())
        def pieces(timing):  # piece -> γ -> {rows (beam) or requests -> mean ms}
            by: dict = {"beam": {}, "MTAD acceptance": {}, "FLy acceptance": {}}
            for r in core["rows"]:
                if "graph_us" not in r or timing not in r:  # a GPU's rows only
                    continue
                if r["piece"].startswith("beam step"):  # by rows (B·W), whatever the split
                    by["beam"].setdefault(r["gamma"], {}).setdefault(r["rows"], []).append(
                        r[timing])
                elif r["piece"] in by:
                    by[r["piece"]].setdefault(r["gamma"], {}).setdefault(
                        r["batch"], []).append(r[timing])
            return {piece: {g: {x: sum(v) / len(v) / 1e3 for x, v in pts.items()}
                            for g, pts in values.items()} for piece, values in by.items()}

        graph = pieces("graph_us")
        return cls(target={(r["batch"], r["tokens_each"]): r["ms"] for r in rows
                           if r["model"] == "target"},
                   draft={r["batch"]: r["ms"] for r in rows if r["model"] == "draft"},
                   beam_step=graph["beam"], acceptance=graph["MTAD acceptance"],
                   fly_acceptance=graph["FLy acceptance"], eager=pieces("eager_us"))

    def prices(self, rule: str, batch: int, width: int, gamma: int, charges: Charges
               ) -> StepPrices:
        """The parts of one step of ``rule`` ("target", "vllm_sd", "fly", "mtad") at batch B,
        W beams and γ, in ms, as the policy's formula takes them: the verification (the target pass
        at exactly (B, γ + 1), never guessed; flat: at (B, 1)), the draft's first pass and
        each later draft step (the draft forward over their rows plus, with ``rule_work``, a
        beam step of the core over the same rows: one chain for vLLM SD and FLy) and the rest
        (the host overhead of the rule's engine plus, with ``rule_work``, the rule's acceptance
        at B)."""
        work = charges.rule_work and gamma > 0 and not (
            rule == "vllm_sd" and charges.sd_work == "none")
        eager = charges.eager_core and rule in ("mtad", "fly")
        beam = (self.eager["beam"] if eager else self.beam_step).get(gamma, {})
        mtad_accept = self.eager["MTAD acceptance"] if eager else self.acceptance
        fly_accept = self.eager["FLy acceptance"] if eager else self.fly_acceptance
        accept = {"mtad": mtad_accept, "fly": fly_accept,
                  "vllm_sd": fly_accept if charges.sd_work == "fly" else mtad_accept
                  }.get(rule, {})

        def draft_step(rows):
            return interpolate(self.draft, rows) + (interpolate(beam, rows) if work else 0.0)

        def verify(tokens):
            return self.target[(batch, 1 if charges.flat_verify else int(tokens) // batch)]

        def rest(requests):
            return charges.host_ms(engine_of_rule(rule, width)) + (
                interpolate(accept[gamma], requests) if work else 0.0)

        return StepPrices(verify=verify, first_pass=draft_step, beam_step=draft_step,
                          rest=rest)

    def step_ms(self, batch: int, width: int, gamma: int, rule: str,
                charges: Charges = Charges()) -> float:
        """One step of B requests by vllm_mtad.policy.cost.step_price: the target alone
        (γ = 0) or a drafting step whose first pass reads B rows (one token each)."""
        return step_price(self.prices(rule, batch, width, gamma, charges), batch, width,
                          gamma, first_pass_tokens=batch)


def rule_of(config: str) -> tuple[str, int, int]:
    """(rule, W, γ) of a T=0 configuration name: "vllm_sd_greedy g4 T0" -> ("vllm_sd", 1, 4),
    "fly g8 T0" -> ("fly", 1, 8), "mtad w4 g8 T0" -> ("mtad", 4, 8)."""
    cut = config.split(" ")
    g = int(cut[-2][1:])
    if cut[0] == "mtad":
        return "mtad", int(cut[1][1:]), g
    return ("fly" if cut[0] == "fly" else "vllm_sd"), 1, g


def measured_projection(tokens_per_pass: dict[str, float], parts: MeasuredParts,
                        batches=(1, 4, 16), charges: Charges = Charges()) -> list[dict]:
    """Per T=0 configuration ("vllm_sd_greedy g4 T0", "fly g8 T0", "mtad w4 g8 T0", ...) and
    batch: step ms, and tokens per second over the target alone and over vLLM SD at the same
    γ, every rule charged by ``charges``; and over vLLM SD with the forwards only (no rule's
    sampling, acceptance or host overhead)."""
    bare = Charges(rule_work=False, flat_verify=charges.flat_verify)
    out = []
    for config, tpp in tokens_per_pass.items():
        rule, w, g = rule_of(config)
        sd = tokens_per_pass.get(f"vllm_sd_greedy g{g} T0")
        if sd is None:
            continue
        row = dict(config=config, rule=rule, w=w, g=g, tokens_per_pass=tpp)
        for b in batches:
            step = parts.step_ms(b, w, g, rule, charges)
            speed = b * tpp / step
            row[f"step ms b{b}"] = step
            row[f"vs target b{b}"] = speed / (b / parts.step_ms(b, 1, 0, "target", charges))
            row[f"vs SD b{b}"] = speed / (b * sd / parts.step_ms(b, 1, g, "vllm_sd", charges))
            row[f"vs SD b{b}, forwards only"] = (
                b * tpp / parts.step_ms(b, w, g, rule, bare)) / (
                b * sd / parts.step_ms(b, 1, g, "vllm_sd", bare))
        out.append(row)
    return out


# ---- deployed shapes, from the measured pair by a stated scaling ----

def forward_fit(anchors: Sequence[tuple[int, int, float]]) -> tuple[float, float]:
    """(ms per layer, ms per GB read) through two measured one-token forwards, each (layers,
    bytes read, ms): the stated model of a decoding forward at batch 1, a fixed cost per layer
    (launches, small kernels) plus the weights read at one bandwidth."""
    (l1, b1, t1), (l2, b2, t2) = anchors
    det = l1 * b2 - l2 * b1
    if det == 0:
        raise ValueError("the two anchors have proportional layers and bytes: no fit")
    per_layer = (t1 * b2 - t2 * b1) / det
    per_byte = (l1 * t2 - l2 * t1) / det
    if per_layer < 0 or per_byte <= 0:
        raise ValueError(f"the anchors give a negative cost: {per_layer} ms a layer, "
                         f"{per_byte} ms a byte")
    return per_layer, per_byte * 1e9


def scaled_parts(parts: MeasuredParts, anchor_target, anchor_draft, target, draft
                 ) -> tuple[MeasuredParts, dict]:
    """``parts`` (measured at the anchor shapes) carried to ``target`` and ``draft``
    (benchmarks.lib.shapes.Shape): a one-token forward by ``forward_fit`` through the anchors'
    two measured one-token forwards, and every other size by the anchor's own measured ratio
    to its one-token forward (the target's (B, t) over (1, 1), the draft's rows over 1). The
    core's pieces are kept (they depend on the vocabulary, within 16 % across these shapes).
    Returns the parts and the fit."""
    per_layer, per_gb = forward_fit([
        (anchor_target.layers, anchor_target.bytes_read(), parts.target[(1, 1)]),
        (anchor_draft.layers, anchor_draft.bytes_read(), parts.draft[1])])

    def one(shape):
        return per_layer * shape.layers + per_gb * shape.bytes_read() / 1e9

    t1, d1 = one(target), one(draft)
    base_t, base_d = parts.target[(1, 1)], parts.draft[1]
    fit = {"ms_per_layer": per_layer, "ms_per_gb": per_gb, "target_1_token_ms": t1,
           "draft_1_row_ms": d1, "draft_over_target": d1 / t1}
    return replace(parts, target={k: t1 * v / base_t for k, v in parts.target.items()},
                   draft={k: d1 * v / base_d for k, v in parts.draft.items()}), fit


# ---- the host overhead, measured on this CPU (benchmarks.phases overhead) ----

def host_overheads(overhead: dict) -> dict[str, float]:
    """ms a step of host work per engine (beyond the forwards and the samplers) from
    benchmarks.phases overhead's JSON."""
    return {r["config"]: r["host"] for r in overhead["rows"]}


def cpu_step_check(overhead: dict, charges_host: bool = True, charges_vocab: bool = True
                   ) -> list[dict]:
    """This CPU's measured steps priced by the policy's formula from their measured parts:
    per engine of benchmarks.phases overhead's runs, the forwards (target and draft, as the
    phase counters split them), the samplers and the host overhead; tokens per second over
    the target alone, predicted against measured. With every term the two agree; leaving the
    host overhead or the samplers out (``charges_host``, ``charges_vocab``) moves each ratio
    by what that term weighs in the engine's step against the target alone's."""
    out = []
    by_repeat: dict = {}
    for r in overhead["runs"]:
        by_repeat.setdefault(r["repeat"], {})[r["config"]] = r
    for repeat, by in sorted(by_repeat.items()):
        steps = {}
        for name, r in by.items():
            ph = r["phases"]
            host = r["host"] if charges_host else 0.0
            vocab = r["vocab_work"] if charges_vocab else 0.0
            prices = StepPrices(verify=lambda n, f=ph["target_forward"]: f,
                                first_pass=lambda n, f=ph["draft_forward"]: f,
                                beam_step=lambda n: 0.0,
                                rest=lambda b, h=host + vocab: h)
            # the forwards as the counters sum them per step: one verify, one draft term
            steps[name] = (step_price(prices, 1, 1, 0 if name == "target" else 1),
                           r["tokens_per_step"], r["wall"])
        t_step, t_tps, t_wall = steps["target"]
        for name, (step, tps, wall) in steps.items():
            out.append(dict(repeat=repeat, config=name,
                            predicted=(tps / step) / (t_tps / t_step),
                            measured=(tps / wall) / (t_tps / t_wall)))
    return out


# ---- the projection per deployed shape, every rule charged its own work ----

HOST_SWEEP = (0.1, 0.3, 1.0)  # ms a step, every engine alike


def scenarios(host_cpu: dict) -> dict[str, Charges]:
    """The cases a deployed projection is priced in. "central": every rule its own sampling
    and acceptance (vLLM SD's, never timed, as one chain's), no host overhead, the
    verification as timed; the others move one assumption each."""
    out = {"central": Charges(),
           "SD's sampling and acceptance free": Charges(sd_work="none"),
           "SD pays FLy's acceptance": Charges(sd_work="fly"),
           "verification flat (as one token)": Charges(flat_verify=True)}
    out |= {f"host {h:g} ms a step": Charges(host=h) for h in HOST_SWEEP}
    out["MTAD's engine's core eager (as run today)"] = Charges(eager_core=True)
    out["host as on this CPU, per engine"] = Charges(host=host_cpu)
    out["host as on this CPU, verification flat"] = Charges(host=host_cpu, flat_verify=True)
    return out


def pair_parts(forwards: dict, core: dict, mode: str) -> list[tuple[str, bool, MeasuredParts,
                                                                   dict]]:
    """(pair, assumed, parts, fit) for the real pair (measured) and each deployed pair:
    measured where ``forwards`` timed both its shapes, else carried from the real pair by
    ``scaled_parts`` (assumed)."""
    from benchmarks.lib.shapes import DEPLOYED, REAL_PAIR

    real_target, real_draft = REAL_PAIR[1]
    real = MeasuredParts.from_reports(forwards, core, mode, [real_target.name, real_draft.name])
    out = [(REAL_PAIR[0], False, real, {})]
    timed = {r.get("shape") for r in forwards["rows"] if r["mode"] == mode and "ms" in r}
    for pair, (target, draft) in DEPLOYED.items():
        if {target.name, draft.name} <= timed:
            out.append((pair, False, MeasuredParts.from_reports(
                forwards, core, mode, [target.name, draft.name]), {}))
        else:
            parts, fit = scaled_parts(real, real_target, real_draft, target, draft)
            out.append((pair, True, parts, fit))
    return out


def deployed_projection(tokens_per_pass: dict[str, float], forwards: dict, core: dict,
                        mode: str, host_cpu: dict[int, dict], batches=(1, 4, 16)) -> dict:
    """Per pair (the real one and the deployed ones), T=0 configuration and batch: tok/s over
    vLLM SD at the same γ and over the target alone in every case of :func:`scenarios`, the
    central case and the range; and the arm the policy would choose (the most tokens a second
    by the same formula among the target alone and MTAD's measured arms with W ≤ 4).
    ``host_cpu``: batch -> {engine -> host ms a step} (the nearest batch at or below)."""
    rows, choices, fits = [], [], {}
    for pair, assumed, parts, fit in pair_parts(forwards, core, mode):
        fits[pair] = fit
        for b in batches:
            host = host_cpu[max(k for k in host_cpu if k <= b)]
            cases = scenarios(host)
            speed = {name: {} for name in cases}
            for name, charges in cases.items():
                speed[name]["target"] = b / parts.step_ms(b, 1, 0, "target", charges)
                for config, tpp in tokens_per_pass.items():
                    rule, w, g = rule_of(config)
                    speed[name][config] = b * tpp / parts.step_ms(b, w, g, rule, charges)
            for config, tpp in tokens_per_pass.items():
                rule, w, g = rule_of(config)
                sd = f"vllm_sd_greedy g{g} T0"
                if sd not in tokens_per_pass:
                    continue
                row = dict(pair=pair, assumed=assumed, batch=b, config=config, rule=rule, w=w,
                           g=g, tokens_per_pass=tpp, cases={})
                for name in cases:
                    row["cases"][name] = {"vs SD": speed[name][config] / speed[name][sd],
                                          "vs target": speed[name][config] / speed[name][
                                              "target"]}
                for over in ("vs SD", "vs target"):
                    values = [c[over] for c in row["cases"].values()]
                    row[over] = row["cases"]["central"][over]
                    row[f"{over} min"], row[f"{over} max"] = min(values), max(values)
                rows.append(row)
            for name in cases:
                arms = {c: v for c, v in speed[name].items()
                        if c == "target" or (c.startswith("mtad w") and rule_of(c)[1] <= 4)}
                best = max(arms, key=arms.get)
                choices.append(dict(pair=pair, batch=b, case=name, choice=best,
                                    vs_target=arms[best] / arms["target"]))
    return {"benchmark": "deployed projection", "forwards_mode": mode, "fits": fits,
            "scenarios": list(scenarios({})), "rows": rows, "choices": choices,
            "table": deployed_table(rows, choices)}


def deployed_table(rows: list[dict], choices: list[dict]) -> str:
    """Batch 1: per pair and rule at γ 4 and 8, over vLLM SD and over the target alone, the
    central case [the range over the cases]; and the policy's choice per case."""
    def cell(r, over):
        return f"{r[over]:.2f} [{r[over + ' min']:.2f}–{r[over + ' max']:.2f}]"

    pairs = list(dict.fromkeys(r["pair"] for r in rows))
    lines = ["| pair | rule | γ | tokens / pass | vs vLLM SD | vs target alone |",
             "|---|---|---|---|---|---|"]
    for pair in pairs:
        sel = [r for r in rows if r["pair"] == pair and r["batch"] == 1
               and (r["rule"] != "mtad" or r["w"] in (1, 4))]
        for r in sorted(sel, key=lambda r: (r["g"], r["rule"] != "vllm_sd", r["rule"], r["w"])):
            name = {"vllm_sd": "vLLM SD", "fly": "FLy"}.get(r["rule"], f"MTAD W={r['w']}")
            label = pair + (" (assumed)" if r["assumed"] else " (measured)")
            lines.append(f"| {label} | {name} | {r['g']} | {r['tokens_per_pass']:.2f} | "
                         f"{cell(r, 'vs SD')} | {cell(r, 'vs target')} |")
    lines += ["", "The policy's choice at batch 1 (central case; in brackets: the cases that "
              "choose otherwise)", "", "| pair | choice | vs target alone | otherwise |",
              "|---|---|---|---|"]
    for pair in pairs:
        sel = [c for c in choices if c["pair"] == pair and c["batch"] == 1]
        central = next(c for c in sel if c["case"] == "central")
        other = "; ".join(f"{c['case']}: {c['choice']}" for c in sel
                          if c["choice"] != central["choice"])
        lines.append(f"| {pair} | {central['choice']} | {central['vs_target']:.2f} | "
                     f"{other or '–'} |")
    return "\n".join(lines)
