"""Micro-benchmarks at real sizes: the vocabulary-wide kernels of one MTAD draft step (no model),
a decoder's forwards at a model's shapes (random weights), and one decision of the policy.

    python -m benchmarks.kernels vocab ...    # beam step, noise, selection: definition vs ours
    python -m benchmarks.kernels core ...     # one step's core, eager and as a CUDA graph
    python -m benchmarks.kernels forwards ... # a decoder's forwards at a model's shapes; --project
    python -m benchmarks.kernels policy ...   # what one policy decision costs on the host

``python -m benchmarks.kernels vocab --help`` (or ``core``, ``forwards``, ``policy``) says more.
Plain PyTorch (vLLM only for the environment record of ``policy``), so ``vocab``, ``core`` and
``forwards`` run where vLLM does not (``--device cuda``). JSON and Markdown in
benchmarks/results/ unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.lib.graphs import capture, clock
from benchmarks.lib.report import (RESULTS, code_commit, code_version, cpu_model_and_flags,
                                   environment, markdown_table, write_outputs)
from benchmarks.lib.runner import run_view
from benchmarks.lib.shapes import DEPLOYED, REAL_PAIR, TINY_DRAFT, TINY_TARGET, Shape

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

CORE_DOC = """The vLLM-free core of one MTAD step at real sizes, eager and as a CUDA graph.

No model and no vLLM: random logits of the real pair's vocabulary (151,936), B requests × W
beams (B·W up to 256 by default), γ = 4 and 8, every row sampled (T=1, top-k 10, top-p 0.9).
Per piece: the draft step's processing by k-selection (and the definition's full sort, for
scale), the noise at the candidates and over all W·V, the selection of W beams, the whole
sparse beam step at step γ, the best beam, and MTAD's and FLy's acceptance on a dense target.

On CUDA each piece is also captured into a CUDA graph; its inputs are then changed in place
and the replay is checked against an eager call on the new inputs (exact equality: the noise
is counter-based, so eager and replay draw the same), and both are timed, interleaved,
median and [min, max] of the repeats. Each piece is also run on the CPU at the smallest
configuration and compared with the device's answer. On the CPU alone (tests, a look at the
pieces) there is no graph column.

    python -m benchmarks.kernels core --device cuda
    python -m benchmarks.kernels core --vocab 4096 --configs 1x4,4x4    # CPU, small
"""


# ---- vocab: the vocabulary-wide kernels of one draft step ----

V = 151_936
W = 4


def timed(fn, device, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one warm-up call."""
    clock(fn, device, 1)
    times = [clock(fn, device, 1) for _ in range(repeats)]
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
    sizing = size_candidates(V, W, [False] * R, [10] * R, [0.9] * R)
    greedy = torch.zeros(batch, dtype=torch.bool, device=device)
    seeds = torch.arange(batch, device=device)
    pos = torch.arange(batch, device=device) + 100
    keys = noise.row_keys(seeds, pos, 2, noise.STREAM_DRAFT)
    noise_keys = NoiseKeys(greedy, seeds, pos)  # any_sampled read from greedy (a sync)
    noise_keys_host = NoiseKeys(greedy, seeds, pos, any_sampled=True)

    cands = draft_candidates(logits, temp, top_k, top_p, sizing)
    dense_lp = processed_logprobs(logits, temp, top_k, top_p)
    first = beam_step(StepCandidates(cands.logprobs[:batch, None], cands.token_ids[:batch, None],
                                     V), None, W, noise_keys_host, 1)
    pieces = {
        "processing: definition (full sort)":
            lambda: processed_logprobs(logits, temp, top_k, top_p),
        "processing: k-selection (draft_candidates)":
            lambda: draft_candidates(logits, temp, top_k, top_p, sizing),
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


# ---- core: one step's vLLM-free core, eager and replayed from a CUDA graph ----

def tensors_of(value) -> list:
    """The tensors a piece returns, in a fixed order (tensor, tuple/list, dataclass)."""
    import dataclasses

    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_of(v)]
    if dataclasses.is_dataclass(value):
        return [t for f in dataclasses.fields(value) for t in tensors_of(getattr(value, f.name))]
    return []


def same(a, b, exact: bool = True) -> tuple[bool, float, int]:
    """(equal, largest difference of the finite entries, integer entries that differ) of two
    pieces' answers; exact, or within float rounding (answers from two devices)."""
    import torch

    xs, ys = tensors_of(a), tensors_of(b)
    if len(xs) != len(ys):
        return False, float("inf"), -1
    ok, worst, ints = True, 0.0, 0
    for x, y in zip(xs, ys):
        x, y = x.cpu(), y.cpu()
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, float("inf"), -1
        if not x.is_floating_point():
            ints += int((x != y).sum())
            continue
        x, y = x.double(), y.double()
        both = torch.isfinite(x) & torch.isfinite(y)
        ok &= bool(((x == y) | (x.isnan() & y.isnan()) | both).all())  # same infinities
        diff = (x - y).abs()[both]
        if diff.numel():
            worst = max(worst, float(diff.max()))
        if exact:
            ok &= bool(torch.equal(x.nan_to_num(), y.nan_to_num()))
        else:
            ok &= bool(torch.allclose(x[both], y[both], rtol=1e-4, atol=1e-4))
    return ok and ints == 0, worst, ints


def core_inputs(batch: int, width: int, gamma: int, vocab: int, device, seed: int = 0) -> dict:
    """Static inputs of one configuration (CPU tensors; moved by the caller): the draft
    model's logits for B·W rows, a beam state of γ−1 steps, and a target and draft for the
    acceptance (draft tokens sampled from a draft close to the target, so that the rules
    accept some and reject some)."""
    import torch

    from vllm_mtad.core import BeamState
    from vllm_mtad.core.processing import processed_logprobs

    gen = torch.Generator().manual_seed(seed)
    B, W, G, V = batch, width, gamma, vocab
    R = B * W

    def settings(rows):
        return (torch.ones(rows), torch.full((rows,), 10), torch.full((rows,), 0.9))

    target_logits = torch.randn(B * (G + 1), V, generator=gen) * 3
    draft_logits = target_logits + torch.randn(B * (G + 1), V, generator=gen)
    target_lp = processed_logprobs(target_logits, *settings(B * (G + 1))).view(B, G + 1, V)
    draft_lp = processed_logprobs(draft_logits, *settings(B * (G + 1))).view(B, G + 1, V)
    gumbel = -torch.log(-torch.log(torch.rand(B, G, V, generator=gen).clamp(1e-12, 1 - 1e-7)))
    drafts = (draft_lp[:, :G] + gumbel).argmax(dim=2)
    state = BeamState(
        scores=-torch.rand(B, W, generator=gen) * 5,
        tokens=torch.randint(0, V, (B, W, G - 1), generator=gen),
        token_logprobs=-torch.rand(B, W, G - 1, generator=gen),
        parents=torch.randint(0, W, (B, W), generator=gen))
    inputs = {
        "logits": (torch.randn(R, V, generator=gen) * 3).to(torch.bfloat16),
        "temperature": settings(R)[0], "top_k": settings(R)[1], "top_p": settings(R)[2],
        "greedy": torch.zeros(B, dtype=torch.bool), "seeds": torch.arange(B) * 7919 + seed,
        "positions": torch.arange(B) + 100, "state": state,
        "target_lp": target_lp, "draft_lp": draft_lp, "drafts": drafts,
        "draft_token_lp": draft_lp[:, :G].gather(2, drafts[:, :, None])[:, :, 0],
        "threshold": torch.full((B,), 0.1), "exact": torch.zeros(B, dtype=torch.bool),
        "num_drafts": torch.full((B,), G), "bonus": target_lp[:, G].argmax(dim=1),
    }
    return to_device(inputs, device)


def to_device(value, device):
    import dataclasses

    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: to_device(getattr(value, f.name), device)
                                             for f in dataclasses.fields(value)})
    return value


def core_pieces(x: dict, width: int, gamma: int, vocab: int) -> dict:
    """name -> a call on the static inputs ``x`` (it reads them when called, so a captured
    graph sees inputs changed in place)."""
    import torch

    from vllm_mtad.core import (Bonus, DenseTarget, NoiseKeys, StepCandidates, beam_step,
                                best_beam, mtad_accept, noise)
    from vllm_mtad.core.beam import _select
    from vllm_mtad.core.fly import FlyDraft, FlyGate, default_window, fly_accept, top_k_entropy
    from vllm_mtad.core.processing import (draft_candidates, processed_logprobs,
                                           size_candidates)

    W, G, V = width, gamma, vocab
    B = x["seeds"].shape[0]
    sizing = size_candidates(V, W, [False] * (B * W), [10] * (B * W), [0.9] * (B * W))
    K = sizing.num_candidates
    settings = (x["temperature"], x["top_k"], x["top_p"])

    def keys():  # any_sampled known on the host: no device read
        return NoiseKeys(x["greedy"], x["seeds"], x["positions"], any_sampled=True)

    def candidates():
        return draft_candidates(x["logits"], *settings, sizing)

    def step_candidates(c):
        return StepCandidates(c.logprobs.view(B, W, K), c.token_ids.view(B, W, K), V)

    def candidate_columns():
        beam = torch.arange(W, device=x["logits"].device)
        ids = x["logits"].view(B, W, V)[:, :, :K].to(torch.int64) % V
        return (beam[None, :, None] * V + ids).reshape(B, W * K)

    def row():
        return noise.row_keys(x["seeds"], x["positions"], G, noise.STREAM_DRAFT)

    def joint():  # [B, W·K] scores of the candidates, as the beam step forms them
        return (x["state"].scores[:, :, None]
                + x["logits"].view(B, W, V)[:, :, :K].float()).reshape(B, W * K)

    def fly():
        target = DenseTarget(x["target_lp"])
        draft = FlyDraft(x["drafts"], x["draft_token_lp"],
                         lambda index, needed: DenseTarget(x["draft_lp"]).candidates_at(index))
        entropy = top_k_entropy(x["target_lp"][:, :G])
        return fly_accept(draft, target, entropy, Bonus(x["num_drafts"], x["bonus"]),
                          FlyGate(default_window(G)), keys())

    return {
        "processing: definition (full sort)": lambda: processed_logprobs(x["logits"], *settings),
        "processing: k-selection": candidates,
        "noise at the W·K candidates": lambda: noise.gumbel_at(row(), candidate_columns()),
        "noise for all W·V": lambda: noise.gumbel(row(), W * V),
        "selection: W of W·K": lambda: _select(joint(), joint(), W, None),
        "beam step (sparse), step γ": lambda: beam_step(step_candidates(candidates()),
                                                       x["state"], W, keys(), G),
        "best beam": lambda: best_beam(x["state"]),
        "MTAD acceptance": lambda: mtad_accept(
            x["drafts"], x["draft_token_lp"], x["target_lp"], x["threshold"], x["exact"],
            keys(), Bonus(x["num_drafts"], x["bonus"])),
        "FLy acceptance": fly,
    }


def change_inputs(x: dict) -> None:
    """New values in the same tensors: logits and log-probs shifted along the vocabulary, the
    positions (hence every noise key) moved on, the beam scores rolled."""
    for name in ("logits", "target_lp", "draft_lp"):
        x[name].copy_(x[name].roll(7, dims=-1))
    x["positions"].add_(5)
    x["state"].scores.copy_(x["state"].scores.roll(1, dims=-1) - 0.5)
    x["bonus"].add_(1)


def core_config(batch: int, width: int, gamma: int, vocab: int, device, repeats: int,
                budget_s: float, check_cpu: bool) -> list[dict]:
    """One row per piece of one (B, W, γ) configuration."""
    import torch

    x = core_inputs(batch, width, gamma, vocab, device)
    pieces = core_pieces(x, width, gamma, vocab)
    on_cuda = device.type == "cuda"
    cpu_pieces = None
    if check_cpu and on_cuda:
        x_cpu = core_inputs(batch, width, gamma, vocab, torch.device("cpu"))
        cpu_pieces = core_pieces(x_cpu, width, gamma, vocab)
    rows = []
    for name, fn in pieces.items():
        row = {"batch": batch, "beams": width, "rows": batch * width, "gamma": gamma,
               "piece": name}
        rows.append(row)
        try:
            fn()  # compile, warm up
            if cpu_pieces is not None:
                # The noise is the same function of its keys on every device: bit for bit.
                (row["matches_cpu"], row["cpu_max_diff"], row["cpu_ints_differing"]) = same(
                    fn(), cpu_pieces[name](), exact=name.startswith("noise"))
            graph = None
            if on_cuda:
                try:
                    graph, out = capture(fn)
                    change_inputs(x)
                    if cpu_pieces is not None:  # the CPU's inputs stay the device's
                        change_inputs(x_cpu)
                    graph.replay()
                    row["replay_equals_eager"] = same(out, fn())[0]
                except Exception as exc:  # a piece that cannot be captured: say why
                    row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    graph = None
                    torch.cuda.synchronize()
            once = clock(fn, device, 1)
            calls = max(1, min(100, int(budget_s / max(once, 1e-6) / (2 * repeats))))
            eager, replay = [], []
            for _ in range(repeats):  # interleaved
                eager.append(clock(fn, device, calls))
                if graph is not None:
                    replay.append(clock(graph.replay, device, calls))
            row["eager_us"] = 1e6 * statistics.median(eager)
            row["eager_us_min"], row["eager_us_max"] = 1e6 * min(eager), 1e6 * max(eager)
            if replay:
                row["graph_us"] = 1e6 * statistics.median(replay)
                row["graph_us_min"], row["graph_us_max"] = 1e6 * min(replay), 1e6 * max(replay)
                row["eager_over_graph"] = row["eager_us"] / row["graph_us"]
            row["calls"] = calls
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return rows


def core_main(argv=None):
    import platform

    import torch

    parser = argparse.ArgumentParser(description=CORE_DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vocab", type=int, default=V)
    parser.add_argument("--configs", default="1x4,4x4,16x4,64x4,32x8",
                        help="B×W pairs (requests × beams), comma-separated")
    parser.add_argument("--gammas", default="4,8")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.4,
                        help="seconds of timed calls per piece and mode")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # as one vLLM CPU worker thread
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
    gammas = [int(g) for g in args.gammas.split(",")]
    env = {**cpu_model_and_flags(), "torch": torch.__version__, "device": str(device),
           "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
           "cuda": torch.version.cuda, "machine": platform.machine(),
           "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    columns = [("batch", "B"), ("beams", "W"), ("gamma", "γ"), ("piece", "piece"),
               ("eager_us", "eager µs"), ("graph_us", "graph µs"),
               ("eager_over_graph", "eager/graph"), ("graph", "replay = eager")]
    rows = []

    def save(complete: bool):  # after every configuration: a stopped run keeps its rows
        return write_outputs("core_kernels", {
            "benchmark": "core_kernels", "vocab_size": args.vocab, "args": vars(args),
            "environment": env, "complete": complete, "rows": rows},
            markdown_table(rows, columns), args.out)

    for i, (b, w) in enumerate(configs):
        for gamma in gammas:
            t0 = time.perf_counter()
            new = core_config(b, w, gamma, args.vocab, device, args.repeats, args.budget,
                              check_cpu=i == 0)
            for r in new:
                r["graph"] = ("n/a" if device.type != "cuda" else "error" if "graph_error" in r
                              else "equal" if r.get("replay_equals_eager") else "DIFFERS")
            rows += new
            print(f"B={b} W={w} γ={gamma}: {time.perf_counter() - t0:.1f} s", flush=True)
            save(False)
    out = save(True)
    print(markdown_table(rows, columns))
    problems = [r for r in rows if "error" in r or r["graph"] in ("error", "DIFFERS")
                or r.get("matches_cpu") is False]
    for r in problems:
        print("PROBLEM:", {k: r[k] for k in r if k in ("batch", "beams", "gamma", "piece",
                                                       "error", "graph_error", "graph",
                                                       "matches_cpu", "cpu_max_diff",
                                                       "cpu_ints_differing")})
    print(f"\nwrote {out}/core_kernels.json, core_kernels.md")


# ---- forwards: a decoder's forwards at a model's shapes, and the projection built on them ----

FORWARDS_DOC = """What a target pass and a draft forward cost on a GPU, without vLLM and without the
weights, and the projection of every rule's speed from them.

    python -m benchmarks.kernels forwards --device cuda                    # the real pair
    python -m benchmarks.kernels forwards --device cuda --shapes deployed  # where users deploy
    python -m benchmarks.kernels forwards --tiny                  # CPU, small shapes (tests)
    python -m benchmarks.kernels forwards --shapes deployed --scale 16     # CPU, proves the code
    python -m benchmarks.kernels forwards --project --out DIR     # the projection, no device

A plain PyTorch decoder (benchmarks/lib/decoder.py) of each model's shapes
(benchmarks/lib/shapes.py; random weights, bfloat16 on CUDA), each forward captured into a
CUDA graph and replayed: a target pass over B requests × t tokens (t = 1 for the target alone,
γ + 1 for a verification) and a draft forward over R rows of one token, on a context of
``--context`` tokens in a KV cache. ``--shapes real``: the real pair (Qwen2.5-Coder-1.5B and
0.5B). ``--shapes deployed``: Llama-3.1-8B, Qwen2.5-32B and one GPU's shard of Llama-3.1-70B at
TP=4, and the drafts Qwen2.5-0.5B and Llama-3.2-1B, one model in memory at a time (the largest,
32B, is 66 GB of weights). ``--attention``: "masked" (the causal mask a verification needs; a
boolean mask may rule out the flash kernel) and "unmasked" (no mask for t > 1: the same reads
and products, what a kernel without a boolean mask costs). Every row records the attention
kernel PyTorch dispatched to.

What it is not: vLLM's forward (no paged attention, no fused kernels beyond torch.compile's),
and no tensor-parallel communication for a shard.

``--project`` (no device, no vLLM) prices a step of every rule at T=0 from measured parts
(benchmarks/lib/projection.py, by the policy's own formula vllm_mtad.policy.cost.step_price):
these forwards, the core's pieces replayed from CUDA graphs (``--core``: beam steps, MTAD's and
FLy's acceptance), the tokens per target pass measured on the real pair (``--acceptance``) and
the host overhead per step measured on this CPU (``--overhead``: benchmarks.phases overhead).
Shapes not measured are carried from the real pair's forwards by a stated scaling
(projection.scaled_parts).
"""


def forwards_shapes(args) -> list[tuple[str, Shape]]:
    """(model kind, shape) to time, in order, each scaled down by ``--scale``."""
    if args.tiny:
        models = [("target", TINY_TARGET), ("draft", TINY_DRAFT)]
    elif args.shapes == "deployed":
        targets = list(dict.fromkeys(t for t, _ in DEPLOYED.values()))
        drafts = list(dict.fromkeys(d for _, d in DEPLOYED.values()))
        models = [("target", s) for s in targets] + [("draft", s) for s in drafts]
    else:
        models = [("target", REAL_PAIR[1][0]), ("draft", REAL_PAIR[1][1])]
    return [(kind, s.scaled(args.scale)) for kind, s in models]


def forwards_main(argv=None) -> None:
    import platform

    import torch

    from benchmarks.lib.decoder import Decoder, time_forward

    ap = argparse.ArgumentParser(description=FORWARDS_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tiny", action="store_true", help="small shapes (tests, CPU)")
    ap.add_argument("--shapes", choices=("real", "deployed"), default="real")
    ap.add_argument("--scale", type=int, default=1,
                    help="every width and the layers divided by this (a CPU proof)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--batches", default=None,
                    help="target: requests per pass (default 1,4,16,64; deployed 1,4,16)")
    ap.add_argument("--tokens", default="1,5,9", help="target: tokens per request (γ + 1)")
    ap.add_argument("--rows", default="1,4,16,64,128,256", help="draft: rows per forward")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of timed calls a shape")
    ap.add_argument("--modes", default=None,
                    help="plain (PyTorch's kernels, one per operation) and/or compiled (one "
                         "layer's function by torch.compile); default both on CUDA for the "
                         "real pair, compiled for deployed shapes, plain elsewhere")
    ap.add_argument("--attention", default=None,
                    help="masked and/or unmasked (t > 1 only); default both on CUDA, masked "
                         "elsewhere")
    ap.add_argument("--out", default=None)
    ap.add_argument("--project", action="store_true",
                    help="no timing: the projection from --forwards (default --out's "
                         "forwards.json)")
    ap.add_argument("--forwards", default=None,
                    help="the forwards JSON(s) --project reads, comma-separated, the real "
                         "pair's first (default: --out's forwards.json)")
    ap.add_argument("--core", default="benchmarks/reports/core-gpu-h200/core_kernels.json")
    ap.add_argument("--acceptance", default="benchmarks/reports/acceptance-cpu/acceptance.json")
    ap.add_argument("--overhead", default=None,
                    help="benchmarks.phases overhead JSON (host ms a step per engine)")
    args = ap.parse_args(argv)
    if args.project:
        return forwards_project(args)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    args.modes = args.modes or ("plain" if not cuda else "compiled" if args.shapes ==
                                "deployed" else "compiled,plain")
    args.attention = args.attention or ("masked,unmasked" if cuda else "masked")
    args.batches = args.batches or ("1,4,16" if args.shapes == "deployed" else "1,4,16,64")
    dtype = torch.bfloat16 if cuda else torch.float32
    models = forwards_shapes(args)
    batches = [int(v) for v in args.batches.split(",")]
    tokens = [int(v) for v in args.tokens.split(",")]
    rows_list = [int(v) for v in args.rows.split(",")]
    env = {**cpu_model_and_flags(), "torch": torch.__version__, "device": str(device),
           "gpu": torch.cuda.get_device_name(0) if cuda else None,
           "cuda": torch.version.cuda, "dtype": str(dtype).replace("torch.", ""),
           "machine": platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "graphs": cuda}
    shapes = {s.name: {**s.__dict__, "head_dim": s.head_dim, "parameters": s.parameters(),
                       "bytes_read": s.bytes_read(2 if cuda else 4)} for _, s in models}
    columns = [("mode", "mode"), ("shape", "shape"), ("batch", "requests or rows"),
               ("tokens_each", "tokens each"), ("attention_mask", "mask"), ("ms", "ms (median)"),
               ("ms_min", "min"), ("ms_max", "max"), ("attention", "attention kernel")]
    rows = []

    def save(complete: bool):  # after every shape: a run stopped by a time limit keeps its rows
        return write_outputs("forwards", {
            "benchmark": "forwards", "args": vars(args), "shapes": shapes, "environment": env,
            "complete": complete, "rows": rows}, markdown_table(rows, columns), args.out)

    def measure(mode, model, kind, shape, batch, t, masked):
        started = time.perf_counter()
        try:
            timing = time_forward(model, batch, t, device, args.repeats, args.budget, masked)
        except Exception as exc:  # a mode that fails (a compiler error, memory): say so, go on
            timing = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rows.append({"mode": mode, "model": kind, "shape": shape.name, "batch": batch,
                     "tokens_each": t, "tokens": batch * t,
                     "attention_mask": "causal" if masked and t > 1 else "none", **timing,
                     "seconds": time.perf_counter() - started})
        print(f"{mode} {shape.name} {batch}x{t} {rows[-1]['attention_mask']}: "
              f"{timing.get('ms', timing.get('error'))} {timing.get('attention', '')}",
              flush=True)
        save(False)

    masks = [a == "masked" for a in args.attention.split(",")]
    with torch.inference_mode():
        for mode in args.modes.split(","):
            for kind, shape in models:
                if kind == "target":
                    model = Decoder(shape, max(batches), args.context, max(tokens), device,
                                    dtype, mode == "compiled")
                    for b in batches:
                        for t in tokens:
                            for masked in masks if t > 1 else masks[:1]:
                                measure(mode, model, kind, shape, b, t, masked)
                else:
                    model = Decoder(shape, max(rows_list), args.context, 1, device, dtype,
                                    mode == "compiled")
                    for r in rows_list:
                        measure(mode, model, kind, shape, r, 1, True)
                del model  # one model in memory at a time
                if cuda:
                    torch.cuda.empty_cache()
    out = save(True)
    print(markdown_table(rows, columns))
    print(f"\nwrote {out}/forwards.json, forwards.md")


def forwards_assumptions(parts) -> dict:
    """The stated GPU model's three assumptions, read off the measured parts: how flat a target
    pass is in its tokens, what a draft forward costs against a target pass, and how much beam
    rows add to a draft forward."""
    t, d = parts.target, parts.draft
    return {
        "target pass over n tokens / over 1 (B×t)": {
            f"{b}x{k}": t[(b, k)] / t[(1, 1)] for b, k in sorted(t)},
        "draft forward over B rows / target pass over B(γ+1) tokens": {
            f"B={b} γ={g}": d[b] / t[(b, g + 1)] for b in (1, 4, 16) for g in (4, 8)
            if b in d and (b, g + 1) in t},
        "draft forward over n rows / over 1": {str(r): d[r] / d[1] for r in sorted(d)},
    }


# The projection's own code, beside report.code_version's defaults.
PROJECTION_CODE = ("benchmarks/kernels.py", "benchmarks/lib/projection.py",
                   "benchmarks/lib/shapes.py")


def forwards_project(args) -> None:
    import json
    from pathlib import Path

    from benchmarks.lib.projection import (MeasuredParts, deployed_projection, forwards_mode,
                                           host_overheads, measured_projection,
                                           t0_tokens_per_pass)

    out = Path(args.out) if args.out else None
    sources = ([Path(p) for p in args.forwards.split(",")] if args.forwards
               else [(out or RESULTS) / "forwards.json"])
    runs = [json.loads(p.read_text()) for p in sources]  # the real pair's first
    forwards = runs[0] | {"rows": [r for run in runs for r in run["rows"]]}
    source = ",".join(map(str, sources))
    core = json.loads(Path(args.core).read_text())
    tpp = t0_tokens_per_pass(json.loads(Path(args.acceptance).read_text()))
    overheads = [json.loads(Path(p).read_text()) for p in (args.overhead or "").split(",") if p]
    mode = forwards_mode(forwards)
    parts = MeasuredParts.from_reports(forwards, core, mode,
                                       shapes=[s.name for s in REAL_PAIR[1]])
    rows = measured_projection(tpp, parts)
    checks = forwards_assumptions(parts)
    heads = [k for k in rows[0] if k.startswith(("step", "vs"))]
    lines = ["| rule | W | γ | tokens / pass | " + " | ".join(heads) + " |",
             "|---" * (4 + len(heads)) + "|"]
    for r in sorted(rows, key=lambda r: (r["g"], r["config"])):
        lines.append(f"| {r['config']} | {r['w']} | {r['g']} | {r['tokens_per_pass']:.2f} | "
                     + " | ".join(f"{r[h]:.2f}" for h in heads) + " |")
    for name, values in checks.items():
        lines += ["", f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items())]
    where = write_outputs("projection", {
        "benchmark": "forwards projection", "forwards_mode": mode,
        "forwards_environment": forwards["environment"],
        "core_environment": core["environment"], "core": args.core,
        "acceptance": args.acceptance, "assumptions": checks, "rows": rows},
        "\n".join(lines), out)
    print("\n".join(lines))
    if overheads:  # every rule charged its own work, per shape, with the host overhead swept
        host = {1: host_overheads(overheads[0])} | {
            int(o["args"]["batch"]): host_overheads(o) for o in overheads}
        deployed = deployed_projection(tpp, forwards, core, mode, host)
        write_outputs("deployed_projection", deployed | {
            "forwards": source, "core": args.core, "acceptance": args.acceptance,
            "overhead": args.overhead, "code_commit": code_commit(),
            "code_version": code_version(extra=PROJECTION_CODE)},
            deployed["table"], out)
        plot_deployed(deployed, Path(where) / "deployed_projection.png")
        print(deployed["table"])
    print(f"\nwrote {where}/projection.json, .md" + (", deployed_projection.*" if overheads
                                                     else ""))


def plot_deployed(deployed: dict, path) -> None:
    """Per shape: MTAD W=4, MTAD W=1 and FLy against vLLM SD and the target alone at batch 1,
    γ 4 and 8, the central case as bars and the sweep's range as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in deployed["rows"] if r["batch"] == 1]
    shapes = list(dict.fromkeys(r["pair"] for r in rows))
    rules = [("fly", 1), ("mtad", 1), ("mtad", 4)]
    fig, axes = plt.subplots(2, len(shapes), figsize=(3.2 * len(shapes), 6), sharey="row")
    for col, shape in enumerate(shapes):
        for row, over in enumerate(("SD", "target")):
            ax = axes[row][col]
            for i, (rule, w) in enumerate(rules):
                for j, g in enumerate((4, 8)):
                    r = next(x for x in rows if x["pair"] == shape and
                             x["rule"] == rule and x["w"] == w and x["g"] == g)
                    x = i * 2.5 + j
                    mid, lo, hi = r[f"vs {over}"], r[f"vs {over} min"], r[f"vs {over} max"]
                    ax.bar(x, mid, color="C0" if g == 4 else "C1",
                           label=f"γ={g}" if i == 0 and col == 0 and row == 0 else None)
                    ax.plot([x, x], [lo, hi], color="k", lw=1)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set_xticks([i * 2.5 + 0.5 for i in range(len(rules))])
            ax.set_xticklabels([f"{r} W{w}" if r == "mtad" else "FLy" for r, w in rules],
                               fontsize=8)
            ax.set_title(f"{shape}: over {'vLLM SD' if over == 'SD' else 'the target'}",
                         fontsize=9)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Projected tok/s at batch 1, T=0 (a projection: bars the central case, lines "
                 "the sweep)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


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
    stats["sampled"].long_requests = 50  # drafted by many requests: past the cold start
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
    run_view({"vocab": vocab_main, "core": core_main, "forwards": forwards_main,
              "policy": policy_main}, argv, __doc__.split("\n\n")[1])


if __name__ == "__main__":
    main()
