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
            if not f.name.startswith("_coef") and f.name != "_rates"}


def _encode(batch, costs, stats, bounds, step, budget) -> dict:
    return {
        "batch": _fields(batch) | {"short": [list(k) + [n] for k, n in batch.short]},
        "costs": {name: _fields(getattr(costs, name))
                  for name in ("verify", "first_pass", "beam_step", "rest")}
        | {"no_draft": {str(b): _fields(r) for b, r in costs.no_draft.items()}},
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
    for size, fields in entry["costs"]["no_draft"].items():
        ratio = costs.no_draft_ratio(int(size))
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
    gzip)."""
    policy = _policy_module()
    original = policy.choose
    out = gzip.open(path, "wt")

    def choose(batch, costs, stats, bounds, step, *args, **kwargs):
        budget = kwargs.get("budget", float("inf"))
        entry = _encode(batch, costs, stats, bounds, step, budget)
        plan = original(batch, costs, stats, bounds, step, *args, **kwargs)
        out.write(json.dumps(entry | {"plan": _plan(plan)}) + "\n")
        return plan

    policy.choose = choose
    try:
        yield
    finally:
        policy.choose = original
        out.close()


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
    args = parser.parse_args()
    if args.command == "record":
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
