"""Micro-benchmarks at real sizes, without a model: the vocabulary-wide kernels of one MTAD draft
step, and one decision of the speculation policy.

    python -m benchmarks.kernels vocab ...    # beam step, noise, selection: definition vs ours
    python -m benchmarks.kernels policy ...   # what one policy decision costs on the host

``python -m benchmarks.kernels vocab --help`` (or ``policy --help``) says more. Plain PyTorch
(vLLM only for the environment record of ``policy``), so ``vocab`` runs where vLLM does not
(``--device cuda``). JSON and Markdown in benchmarks/results/ unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.lib.report import environment, markdown_table, write_outputs
from benchmarks.lib.runner import run_view
from devtools.engine import cpu_model_and_flags

VOCAB_DOC = """The vocabulary-wide kernels of one MTAD draft step, timed side by side at real sizes.

No model and no vLLM: random logits of the real pair's vocabulary (151,936), batch B requests
× W beams, the paper's sampling settings (T=1, top-k 10, top-p 0.9). For each piece, the
definition (a full sort; noise for every (beam, token) pair, eager) against what the drafter
runs (one k-selection; noise for the candidates only; the compiled kernel where every token
counts). Runs on the CPU by default, on CUDA with --device cuda (plain PyTorch: it can be
carried to a machine without vLLM).

    python -m benchmarks.kernels vocab                 # B = 1 and 16, W = 4
    python -m benchmarks.kernels vocab --device cuda
"""
POLICY_DOC = """What one decision of the speculation policy costs on the host (no model; vLLM only for the
environment record).

The policy prices every (W, γ) arm before each step (``vllm_mtad.policy.choose``). This
times one decision at a few batch sizes on cost lines and acceptance statistics fed synthetic
samples shaped like the real pair's (a target pass ~0.1 s + 4 ms a token, a draft pass ~30 ms),
requests of the paper's sampling class with 1–48 tokens left, W ≤ 4, γ ≤ 4: the step the
engine would pay before it runs anything.

    python -m benchmarks.kernels policy                # B = 1, 4, 16, 48
"""


# ---- vocab: the vocabulary-wide kernels of one draft step ----

V = 151_936
W = 4


def timed(fn, device, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one warm-up call."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def measure(batch: int, device, repeats: int) -> list[dict]:
    import torch

    from vllm_mtad.core import NoiseKeys, StepCandidates, beam_step, noise
    from vllm_mtad.core.processing import (draft_candidates, size_candidates,
                                           processed_logprobs)

    gen = torch.Generator().manual_seed(0)
    R = batch * W
    logits = (torch.randn(R, V, generator=gen) * 3).to(torch.bfloat16).to(device)
    temp = torch.ones(R, device=device)
    top_k = torch.full((R,), 10, device=device)
    top_p = torch.full((R,), 0.9, device=device)
    plan = size_candidates(V, W, [False] * R, [10] * R, [0.9] * R)
    greedy = torch.zeros(batch, dtype=torch.bool, device=device)
    seeds = torch.arange(batch, device=device)
    pos = torch.arange(batch, device=device) + 100
    keys = noise.row_keys(seeds, pos, 2, noise.STREAM_DRAFT)
    noise_keys = NoiseKeys(greedy, seeds, pos)  # any_sampled read from greedy (a sync)
    noise_keys_host = NoiseKeys(greedy, seeds, pos, any_sampled=True)

    cands = draft_candidates(logits, temp, top_k, top_p, plan)
    dense_lp = processed_logprobs(logits, temp, top_k, top_p)
    first = beam_step(StepCandidates(cands.logprobs[:batch, None], cands.token_ids[:batch, None],
                                     V), None, W, noise_keys_host, 1)
    pieces = {
        "processing: definition (full sort)":
            lambda: processed_logprobs(logits, temp, top_k, top_p),
        "processing: k-selection (draft_candidates)":
            lambda: draft_candidates(logits, temp, top_k, top_p, plan),
        "noise for all W·V candidates, eager":
            lambda: noise._gumbel_dense_eager(keys, W * V),
        "noise for all W·V candidates, compiled":
            lambda: noise.gumbel(keys, W * V),
        "beam step, dense (W·V candidates)":
            lambda: beam_step(dense_lp.view(batch, W, V), first, W, noise_keys, 2),
        "beam step, sparse (W·K candidates)":
            lambda: beam_step(StepCandidates(cands.logprobs.view(batch, W, -1),
                                             cands.token_ids.view(batch, W, -1), V),
                              first, W, noise_keys_host, 2),
    }
    rows = []
    for name, fn in pieces.items():
        reps = 1 if "definition" in name or "eager" in name or "dense (" in name else repeats
        rows.append({"batch": batch, "beams": W, "rows": R, "piece": name,
                     "ms": 1e3 * timed(fn, device, reps)})
    return rows


def vocab_main(argv=None):
    import torch

    parser = argparse.ArgumentParser(description=VOCAB_DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # as one vLLM CPU worker thread
    rows = []
    for b in [int(x) for x in args.batches.split(",")]:
        rows += measure(b, device, args.repeats)
    table = markdown_table(rows, [("batch", "batch"), ("rows", "B·W rows"), ("piece", "piece"),
                                  ("ms", "ms per call")])
    import platform

    env = {**cpu_model_and_flags(), "torch": torch.__version__, "device": str(device),
           "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
           "machine": platform.machine(), "threads": torch.get_num_threads()}
    out = write_outputs("vocab_kernels", {"benchmark": "vocab_kernels", "vocab_size": V,
                                          "beam_width": W, "environment": env, "rows": rows},
                        table, args.out)
    print(table)
    print(f"\nwrote {out}/vocab_kernels.json, vocab_kernels.md")


# ---- policy: one decision of the speculation policy ----

def fed_policy(batch_size: int, seed: int = 0):
    """(costs, stats, bounds, batch) after 64 cost samples and 200 recorded drafts."""
    from vllm_mtad import policy

    rng = random.Random(seed)
    B = batch_size
    costs = policy.CostModel()
    for _ in range(64):
        n = rng.randint(1, 5) * B
        costs.verify.add((n, rng.randint(0, 50)), 0.1 + 0.004 * n)
        costs.first_pass.add((n, rng.randint(0, 50)), 0.03 + 0.001 * n)
        costs.beam_step.add(B * rng.randint(1, 4), 0.03 + 0.001 * B)
        costs.rest.add(B, 0.005)
    for _ in range(4):
        costs.no_draft_ratio(B).add(0.3, 0.28)
    stats = policy.new_stats(4, 4)
    for _ in range(200):
        g = rng.randint(1, 4)
        stats["sampled"].record(rng.randint(1, 4), g, rng.randint(0, g))
    bounds = policy.Bounds(4, 4, 1, 0)
    left = [rng.randint(1, 48) for _ in range(B)]
    demand = policy.RowDemand(["sampled"] * B, tokens_left=left, prompt_tokens=[150] * B,
                              max_tokens=[48] * B)
    batch = policy.Batch.from_step(demand, B, 0, horizon=4)
    return costs, stats, bounds, batch


def time_decisions(batch_size: int, seconds: float) -> float:
    """Mean seconds of one ``choose`` (a step that does not explore: step numbers 1, 2, ...
    skip every 16th), decisions repeated for ``seconds``."""
    from vllm_mtad import policy

    costs, stats, bounds, batch = fed_policy(batch_size)
    policy.choose(batch, costs, stats, bounds, 1)  # warm-up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        n += 1
        policy.choose(batch, costs, stats, bounds, n if n % 16 else n + 1)
    return (time.perf_counter() - start) / n


def policy_main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=POLICY_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 48])
    ap.add_argument("--seconds", type=float, default=0.5, help="per batch size and repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    for B in args.batches:
        ms = [time_decisions(B, args.seconds) * 1e3 for _ in range(args.repeats)]
        rows.append({"batch": B, "ms_median": statistics.median(ms), "ms_min": min(ms),
                     "ms_max": max(ms)})
    table = markdown_table(rows, [("batch", "batch"), ("ms_median", "ms a decision (median)"),
                                  ("ms_min", "min"), ("ms_max", "max")])
    out = write_outputs("policy_decision", {"benchmark": "policy_decision",
                                            "environment": environment(), "args": vars(args),
                                            "rows": rows}, table, args.out)
    print(table)
    print(f"written to {out}")


def main(argv=None) -> None:
    run_view({"vocab": vocab_main, "policy": policy_main}, argv, __doc__.split("\n\n")[1])


if __name__ == "__main__":
    main()
