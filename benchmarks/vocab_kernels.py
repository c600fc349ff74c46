"""The vocabulary-wide kernels of one MTAD draft step, timed side by side at real sizes.

No model and no vLLM: random logits of the real pair's vocabulary (151,936), batch B requests
× W beams, the paper's sampling settings (T=1, top-k 10, top-p 0.9). For each piece, the
definition (a full sort; noise for every (beam, token) pair, eager) against what the drafter
runs (one k-selection; noise for the candidates only; the compiled kernel where every token
counts). Runs on the CPU by default, on CUDA with --device cuda (plain PyTorch: it can be
carried to a machine without vLLM).

    python -m benchmarks.vocab_kernels                 # B = 1 and 16, W = 4
    python -m benchmarks.vocab_kernels --device cuda
"""

from __future__ import annotations

import argparse
import time

from benchmarks.common import markdown_table, write_outputs

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

    from vllm_mtad.core import beam_step, noise
    from vllm_mtad.core.processing import (draft_candidates, plan_candidates,
                                           processed_logprobs)

    gen = torch.Generator().manual_seed(0)
    R = batch * W
    logits = (torch.randn(R, V, generator=gen) * 3).to(torch.bfloat16).to(device)
    temp = torch.ones(R, device=device)
    top_k = torch.full((R,), 10, device=device)
    top_p = torch.full((R,), 0.9, device=device)
    plan = plan_candidates(V, W, [False] * R, [10] * R, [0.9] * R)
    greedy = torch.zeros(batch, dtype=torch.bool, device=device)
    seeds = torch.arange(batch, device=device)
    pos = torch.arange(batch, device=device) + 100
    keys = noise.row_keys(seeds, pos, 2, noise.STREAM_DRAFT)

    cands = draft_candidates(logits, temp, top_k, top_p, plan)
    dense_lp = processed_logprobs(logits, temp, top_k, top_p)
    first = beam_step(cands.logprobs[:batch, None], None, W, greedy, seeds, pos, 1, None,
                      cands.token_ids[:batch, None], V, any_sampled=True)
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
            lambda: beam_step(dense_lp.view(batch, W, V), first, W, greedy, seeds, pos, 2),
        "beam step, sparse (W·K candidates)":
            lambda: beam_step(cands.logprobs.view(batch, W, -1), first, W, greedy, seeds, pos,
                              2, None, cands.token_ids.view(batch, W, -1), V, True),
    }
    rows = []
    for name, fn in pieces.items():
        reps = 1 if "definition" in name or "eager" in name or "dense (" in name else repeats
        rows.append({"batch": batch, "beams": W, "rows": R, "piece": name,
                     "ms": 1e3 * timed(fn, device, reps)})
    return rows


def main(argv=None):
    import torch

    parser = argparse.ArgumentParser(description=__doc__,
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

    env = {"torch": torch.__version__, "device": str(device),
           "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
           "machine": platform.machine(), "threads": torch.get_num_threads()}
    out = write_outputs("vocab_kernels", {"benchmark": "vocab_kernels", "vocab_size": V,
                                          "beam_width": W, "environment": env, "rows": rows},
                        table, args.out)
    print(table)
    print(f"\nwrote {out}/vocab_kernels.json, vocab_kernels.md")


if __name__ == "__main__":
    main()
