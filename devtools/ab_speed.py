"""Before/after: MTAD's decoding speed at two commits, interleaved, on the tiny pair.

For a change that should not change speed (a refactor of host-side code). Each commit is
checked out in a git worktree (its ``patches/`` linked in as ``vllm_mtad/patches``, so that
the worktree's own package is imported, not the editable install's); each round runs one
process per commit, in alternating order (ABBA...), and each process builds an MTAD engine on
the tiny pair (devtools.tiny_models), warms every cell up, then times every cell ``--repeats``
times. The tiny pair makes the forwards cheap, so host-side code is a large share of a step:
where a refactor of Python code would show, it shows here first. Reported per cell (batch,
temperature): tokens/s of each commit (median over rounds and repeats, [min, max]) and the
after/before ratio per round (median, [min, max]).

    python -m devtools.ab_speed --before 43b350d --after HEAD --rounds 2 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CELLS = [(1, 1.0), (1, 0.0), (16, 1.0), (16, 0.0)]  # (batch, temperature)


def _worker(repeats: int, max_tokens: int, policy: str) -> None:
    """Runs in the commit's worktree: time every cell; prints one JSON line."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm_mtad
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from devtools.engine import build_llm, close, mtad_spec
    from devtools.tiny_models import TinyPairSpec, build_tiny_pair

    where = str(Path(vllm_mtad.__file__).parent)
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = build_tiny_pair(tmp)
        llm = build_llm(target, mtad_spec(draft, gamma=4, width=4, speculation_policy=policy),
                        kv_cache_bytes=65536 * TinyPairSpec().kv_bytes_per_token(),
                        enforce_eager=True,
                        enable_prefix_caching=False)
        try:
            def run(batch, temperature):
                prompts = [TokensPrompt(prompt_token_ids=[1 + (i * 7 + j) % 50
                                                          for j in range(8 + i % 5)])
                           for i in range(batch)]
                params = SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                        top_k=10, top_p=0.9, seed=3, ignore_eos=True)
                start = time.perf_counter()
                out = llm.generate(prompts, params, use_tqdm=False)
                seconds = time.perf_counter() - start
                return sum(len(o.outputs[0].token_ids) for o in out) / seconds

            for cell in CELLS:
                run(*cell)  # warm-up
            times = {f"b{b}_T{t:g}": [] for b, t in CELLS}
            for _ in range(repeats):
                for b, t in CELLS:
                    times[f"b{b}_T{t:g}"].append(run(b, t))
        finally:
            close(llm)
    print("AB_RESULT " + json.dumps({"package": where, "tok_s": times}), flush=True)


def _worktree(commit: str, base: Path) -> Path:
    path = base / commit.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit],
                   check=True, capture_output=True)
    (path / "vllm_mtad" / "patches").symlink_to(path / "patches")
    return path


def _run(tree: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{tree}:{ROOT}")
    # By file: the worktree's own devtools/ need not have this script.
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker",
           "--repeats", str(args.repeats), "--max-tokens", str(args.max_tokens),
           "--policy", args.policy]
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("AB_RESULT ")), None)
    if line is None:
        raise RuntimeError(f"worker in {tree} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(line[len("AB_RESULT "):])
    if not result["package"].startswith(str(tree)):
        raise RuntimeError(f"worker in {tree} imported {result['package']}")
    return result["tok_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="HEAD~1")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--policy", default="fixed", choices=["fixed", "adaptive"])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return _worker(args.repeats, args.max_tokens, args.policy)
    from devtools.engine import cpu_model_and_flags

    base = Path(tempfile.mkdtemp(prefix="ab-speed-"))
    trees = {"before": _worktree(args.before, base), "after": _worktree(args.after, base)}
    runs = {"before": [], "after": []}
    started = time.time()
    try:
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name in order:
                print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
                runs[name].append(_run(trees[name], args))
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)
    report = _report(runs, args, time.time() - started, cpu_model_and_flags())
    print(report["markdown"])
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ab_speed.json").write_text(json.dumps(report, indent=1))
        (args.out / "ab_speed.md").write_text(report["markdown"] + "\n")


def _report(runs: dict, args, wall: float, machine: dict) -> dict:
    rows = ["| cell | before tok/s | after tok/s | after / before per round |",
            "|---|---|---|---|"]
    cells = {}
    for key in runs["before"][0]:
        b = [x for run in runs["before"] for x in run[key]]
        a = [x for run in runs["after"] for x in run[key]]
        ratios = [statistics.median(ra[key]) / statistics.median(rb[key])
                  for ra, rb in zip(runs["after"], runs["before"])]
        cells[key] = {"before": b, "after": a, "ratios": ratios}
        rows.append(f"| {key} | {statistics.median(b):.1f} [{min(b):.1f}, {max(b):.1f}] | "
                    f"{statistics.median(a):.1f} [{min(a):.1f}, {max(a):.1f}] | "
                    f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] |")
    head = (f"before {args.before}, after {args.after}; tiny pair, MTAD W=4 γ=4 "
            f"({args.policy} policy), {args.max_tokens} tokens, {args.rounds} rounds x "
            f"{args.repeats} repeats; {machine.get('cpu_model', '?')}; wall {wall / 60:.1f} min")
    return {"cells": cells, "args": vars(args) | {"out": str(args.out)}, "machine": machine,
            "wall_s": wall, "markdown": head + "\n\n" + "\n".join(rows)}


if __name__ == "__main__":
    main()
