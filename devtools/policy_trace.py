"""Record the speculation policy's decisions on a real engine run, and replay them.

``record`` runs the tiny pair (devtools.tiny_models) in-process with the adaptive policy on a
mixed workload (sampled, joint and exact requests; batches of 1 and 6; prompts that arrive
while others decode) and writes every call of the policy's choice — its inputs (the batch,
cost lines, acceptance statistics, bounds, step, exploration budget) as plain fields, and the
plan it returned — as JSONL. ``replay`` rebuilds those inputs with the code it imports and
checks that the choice is the same plan at every step. A refactor of the policy runs
``record`` before and ``replay`` after (tests/test_policy_trace.py replays the checked-in
trace on every test run).

    python -m devtools.policy_trace record --out tests/data/policy-trace.jsonl.gz
    python -m devtools.policy_trace replay tests/data/policy-trace.jsonl.gz
    python -m devtools.policy_trace explain TRACE [--arms 4x1,4x4,4x8]

Each recorded decision also carries when it was made (``t``, seconds) and, once the target has
verified that step's drafts, what it accepted (``accepted``: draft tokens over the step's rows;
``rows``): ``explain`` prices every listed arm at every decision with the recorded inputs and
sets the arm chosen, its predicted tokens per second, beside the realised ones (the step's
tokens over the time to the next decision), and says how often and when the policy explored.
``benchmarks.speed --trace-policy`` records the MTAD default engine's decisions in a speed run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import importlib
import json


def _policy_module():
    """Where the policy's choice lives in the code imported (the package, or the one module
    of earlier commits)."""
    for name in ("vllm_mtad.policy.choice", "vllm_mtad.core.policy"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "choose"):
            return module
    raise ImportError("no speculation policy found (vllm_mtad.policy or vllm_mtad.core.policy)")


def _fields(obj) -> dict:
    """A dataclass's fields by name (private ones included: the fitted sums)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
            if not f.name.startswith("_coef") and f.name not in ("_rates", "_priors")}


def _encode(batch, costs, stats, bounds, step, budget) -> dict:
    return {
        "batch": _fields(batch) | {"short": [list(k) + [n] for k, n in batch.short]},
        "costs": {name: _fields(getattr(costs, name))
                  for name in ("verify", "first_pass", "beam_step", "rest")}
        | {"no_draft": {str(b): _fields(r) for b, r in costs.no_draft.items()}}
        | {"arms": {",".join(map(str, k)): _fields(r)
                    for k, r in getattr(costs, "arms", {}).items()}},
        "stats": {cls: _fields(s) for cls, s in stats.items()},
        "bounds": _fields(bounds), "step": step, "budget": budget}


def _plan(plan) -> dict:
    return {"beam_width": plan.beam_width, "num_tokens": plan.num_tokens,
            "explore": plan.explore, "goodput": plan.goodput, "seconds": plan.seconds,
            "cost": plan.cost}


def _same(a: dict, b: dict) -> bool:
    """The same arm, and its prices equal to 1e-9 relative (the arithmetic may be regrouped)."""
    for key, x in a.items():
        y = b[key]
        if isinstance(x, float) and isinstance(y, float):
            if abs(x - y) > 1e-9 * max(abs(x), abs(y), 1e-12):
                return False
        elif x != y:
            return False
    return True


def _decode(entry: dict, policy):
    """The recorded inputs as the imported code's objects."""
    try:
        from vllm_mtad.policy import cost as cost_mod, stats as stats_mod
    except ImportError:  # one module before the package
        cost_mod = stats_mod = policy
    b = dict(entry["batch"])
    b["short"] = tuple(((cls, left), n) for cls, left, n in b["short"])
    batch = policy.Batch(**b)
    costs = cost_mod.CostModel()
    for name in ("verify", "first_pass", "beam_step", "rest"):
        line = getattr(costs, name)
        for key, value in entry["costs"][name].items():
            setattr(line, key, value)
    ratios = [(costs.no_draft_ratio(int(size)), fields)
              for size, fields in entry["costs"]["no_draft"].items()]
    ratios += [(costs.arm_ratio(*map(int, arm.split(","))), fields)  # recorded since issue 57
               for arm, fields in entry["costs"].get("arms", {}).items()]
    for ratio, fields in ratios:
        for key, value in fields.items():
            setattr(ratio, key, value)
    stats = {}
    for cls, fields in entry["stats"].items():
        s = stats_mod.AcceptanceStats(fields["beam_width"], fields["max_tokens"])
        for key, value in fields.items():
            setattr(s, key, value)
        stats[cls] = s
    return batch, costs, stats, policy.Bounds(**entry["bounds"])


@contextlib.contextmanager
def recording(path: str):
    """Every call of the policy's choice while in the block, appended to ``path`` (JSONL,
    gzip), with its time and, where the controller reports it, what the target accepted of
    that step's drafts (an entry is written when the next decision comes)."""
    import time

    policy = _policy_module()
    original = policy.choose
    out = gzip.open(path, "wt")
    pending = []  # the last decision, written when the next one comes (its acceptance known)
    controller = _controller_class()
    original_record = getattr(controller, "record_acceptance", None)
    original_plan = getattr(controller, "plan", None)
    deciding = {"by": None, "last": None}  # the controller in plan(); the last decision's

    def flush():
        while pending:
            out.write(json.dumps(pending.pop(0)) + "\n")

    def choose(batch, costs, stats, bounds, step, *args, **kwargs):
        budget = kwargs.get("budget", float("inf"))
        # A copy: the entry is written after the next step has changed these objects.
        entry = json.loads(json.dumps(_encode(batch, costs, stats, bounds, step, budget)))
        t = time.perf_counter()
        plan = original(batch, costs, stats, bounds, step, *args, **kwargs)
        flush()
        pending.append(entry | {"plan": _plan(plan), "t": t})
        deciding["last"] = deciding["by"]
        return plan

    def plan_of(self, *args, **kwargs):
        deciding["by"] = self
        try:
            return original_plan(self, *args, **kwargs)
        finally:
            deciding["by"] = None

    def record_acceptance(self, classes, widths, drafted, prefix_accepted):
        original_record(self, classes, widths, drafted, prefix_accepted)
        # Only the engine that made the last decision reports on it (several MTAD engines,
        # forced ones among them, may live in this process).
        if pending and self is deciding["last"] and prefix_accepted.numel():
            pending[-1]["accepted"] = int(prefix_accepted[:, -1].clamp(min=0).sum())
            pending[-1]["rows"] = len(classes)

    policy.choose = choose
    if original_record is not None:
        controller.record_acceptance = record_acceptance
        controller.plan = plan_of
    try:
        yield
    finally:
        policy.choose = original
        if original_record is not None:
            controller.record_acceptance = original_record
            controller.plan = original_plan
        flush()
        out.close()


def _controller_class():
    try:
        from vllm_mtad.policy.controller import SpeculationController
    except ImportError:  # earlier commits
        return None
    return SpeculationController


def explain(path: str, arms: list[tuple[int, int]], every: int = 1) -> str:
    """Per decision (every ``every``-th): the plan, the rows' tokens left, and each of ``arms``
    priced with the recorded inputs (goodput, its tokens); then per arm chosen: steps,
    predicted and realised tokens per second (a step's rows plus accepted tokens over the time
    to the next decision; steps that read a prompt left out), and the explorations."""
    policy = _policy_module()
    with gzip.open(path, "rt") as f:
        entries = [json.loads(line) for line in f]
    lines = ["| # | step | plan | tokens left | " + " | ".join(f"W{w} γ{g}" for w, g in arms)
             + " | realised tok/s |", "|---|---|---|---|" + "---|" * len(arms) + "---|"]
    chosen: dict = {}
    explored = []
    for i, e in enumerate(entries):
        batch, costs, stats, bounds = _decode(e, policy)
        p = e["plan"]
        arm = (p["beam_width"], p["num_tokens"])
        realised = None
        nxt = entries[i + 1] if i + 1 < len(entries) else None
        if nxt is not None and "t" in e and batch.other_tokens == 0 \
                and nxt["batch"]["other_tokens"] == 0:
            tokens = e.get("rows", batch.size) + e.get("accepted", 0)
            realised = tokens / max(nxt["t"] - e["t"], 1e-9)
            c = chosen.setdefault(arm, {"steps": 0, "predicted": [], "tokens": 0, "s": 0.0})
            c["steps"] += 1
            c["tokens"] += tokens
            c["s"] += nxt["t"] - e["t"]
            if p["goodput"] is not None:
                c["predicted"].append(p["goodput"])
        if p["explore"]:
            explored.append(f"{e['step']}: W{arm[0]} γ{arm[1]}")
        if i % every:
            continue
        priced = []
        for w, g in arms:
            if g > bounds.max_tokens or w > bounds.beam_width:
                priced.append("–")
                continue
            value = policy.goodput(batch, costs, stats, w, g)
            priced.append(f"{value:.2f} ({policy.expected_tokens(batch, stats, w, g):.2f})")
        left = f"{batch.remaining_tokens:.0f}"
        lines.append(f"| {i} | {e['step']} | W{arm[0]} γ{arm[1]}{' (explore)' if p['explore'] else ''}"
                     f" | {left} | " + " | ".join(priced) + " | "
                     + ("–" if realised is None else f"{realised:.2f}") + " |")
    lines += ["", "| arm chosen | steps timed | predicted tok/s (mean) | realised tok/s |",
              "|---|---|---|---|"]
    for (w, g), c in sorted(chosen.items(), key=lambda kv: -kv[1]["steps"]):
        pred = sum(c["predicted"]) / len(c["predicted"]) if c["predicted"] else float("nan")
        lines.append(f"| W{w} γ{g} | {c['steps']} | {pred:.2f} | "
                     f"{c['tokens'] / max(c['s'], 1e-9):.2f} |")
    lines += ["", f"{len(entries)} decisions, {len(explored)} explorations"
              + (": " + ", ".join(explored) if explored else ".")]
    return "\n".join(lines)


def replay(path: str) -> tuple[int, list]:
    """(decisions replayed, [(index, recorded plan, replayed plan)] that differ)."""
    policy = _policy_module()
    n, differ = 0, []
    with gzip.open(path, "rt") as f:
        for i, line in enumerate(f):
            entry = json.loads(line)
            batch, costs, stats, bounds = _decode(entry, policy)
            plan = _plan(policy.choose(batch, costs, stats, bounds, entry["step"],
                                       budget=entry["budget"]))
            if not _same(entry["plan"], plan):
                differ.append((i, entry["plan"], plan))
            n += 1
    return n, differ


def _workload(llm) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=[1 + (i * 7 + j) % 50 for j in range(5 + 9 * i)])
               for i in range(6)]
    for extra in ({}, {"greedy_acceptance": "exact"}):
        for temperature in (1.0, 0.0):
            params = SamplingParams(max_tokens=48, temperature=temperature, ignore_eos=True,
                                    seed=7, top_k=10, top_p=0.9, extra_args=extra or None)
            llm.generate(prompts[:1], params, use_tqdm=False)
            llm.generate(prompts, params, use_tqdm=False)


def record(out: str) -> None:
    import os
    import tempfile

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the policy in this process

    from devtools.engine import build_llm, close, mtad_spec
    from devtools.tiny_models import TinyPairSpec, build_tiny_pair

    with tempfile.TemporaryDirectory() as tmp, recording(out):
        target, draft = build_tiny_pair(tmp)
        # The target as its own draft (everything accepted: the policy drafts long), then the
        # tiny draft (little accepted: it mostly does not draft).
        for drafter in (target, draft):
            llm = build_llm(target, mtad_spec(drafter, gamma=4, width=4,
                                              speculation_policy="adaptive"),
                            kv_cache_bytes=16384 * TinyPairSpec().kv_bytes_per_token(),
                            enforce_eager=True,
                            enable_prefix_caching=False)
            try:
                _workload(llm)
            finally:
                close(llm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", required=True)
    rep = sub.add_parser("replay")
    rep.add_argument("trace")
    exp = sub.add_parser("explain")
    exp.add_argument("trace")
    exp.add_argument("--arms", default="1x0,4x1,4x2,4x4,4x8",
                     help="the arms to price at each decision, WxG (default: %(default)s)")
    exp.add_argument("--every", type=int, default=1, help="a table row every N decisions")
    args = parser.parse_args()
    if args.command == "explain":
        arms = [tuple(int(x) for x in a.split("x")) for a in args.arms.split(",")]
        print(explain(args.trace, arms, args.every))
    elif args.command == "record":
        record(args.out)
        n, differ = replay(args.out)
        print(f"recorded {n} decisions to {args.out}")
    else:
        n, differ = replay(args.trace)
        print(f"replayed {n} decisions: {n - len(differ)} the same, {len(differ)} differ")
        for i, was, now in differ[:10]:
            print(f"  decision {i}: recorded {was}, replayed {now}")
        raise SystemExit(1 if differ else 0)


if __name__ == "__main__":
    main()
