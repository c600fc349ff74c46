"""What the real pair's forwards cost on a GPU, without vLLM and without the weights: a plain
PyTorch decoder of each model's shapes (Qwen2.5-Coder-1.5B and 0.5B: layers, heads, grouped
KV heads, MLP width, the 151,936-token vocabulary; random bfloat16 weights), each forward
captured into a CUDA graph and replayed.

    python -m benchmarks.forwards --device cuda
    python -m benchmarks.forwards --tiny                 # CPU, small shapes, no graphs (tests)
    python -m benchmarks.forwards --project --out DIR    # the projection from DIR's forwards

``--project`` (no device, no vLLM needed) prices a step of each rule from the measured parts
(benchmarks/lib/projection.py: MeasuredParts): the compiled forwards here, MTAD's beam steps
and acceptance replayed from CUDA graphs (``--core``, benchmarks.kernels core), and the tokens
per target pass measured on the real pair at T=0 (``--acceptance``, benchmarks.acceptance).

Why: the GPU projection (benchmarks.rules_speed, benchmarks/lib/projection.py) states a cost
model: a target pass flat in its tokens up to 512, a draft forward a fraction 0.05–0.3 of a
target pass, beam rows free up to B·W = 64. This measures those three on a GPU for the real
pair's shapes: a target pass over B requests × t tokens (t = 1 for the target alone, γ + 1 for
a verification) and a draft forward over R rows of one token, each on a context of ``--context``
tokens already in a KV cache (the new tokens attend to it and, causally, to each other).

What it is not: vLLM's forward. No paged attention, no fused kernels beyond what PyTorch's
scaled_dot_product_attention picks; weights random (the cost of a forward does not depend on
their values). Every forward is timed as a graph replay, median and [min, max] of the repeats.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass

from benchmarks.lib.graphs import capture, clock
from benchmarks.lib.report import markdown_table, write_outputs
from devtools.engine import cpu_model_and_flags


@dataclass(frozen=True)
class Shape:
    """A Qwen2 decoder's shapes (the models' config.json)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 151_936

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        h, d = self.hidden, self.head_dim
        attn = h * (self.heads + 2 * self.kv_heads) * d + self.heads * d * h
        mlp = 3 * h * self.intermediate
        return self.layers * (attn + mlp) + 2 * self.vocab * h  # embeddings and lm_head untied


TARGET = Shape("Qwen2.5-Coder-1.5B", 1536, 28, 12, 2, 8960)
DRAFT = Shape("Qwen2.5-Coder-0.5B", 896, 24, 14, 2, 4864)
TINY_TARGET = Shape("tiny target", 64, 2, 4, 2, 128, vocab=512)
TINY_DRAFT = Shape("tiny draft", 32, 2, 4, 2, 64, vocab=512)


class Decoder:
    """Random weights of ``shape``, a KV cache of ``rows`` sequences holding ``context`` tokens,
    and a forward of ``t`` new tokens per row (the logits of every new token)."""

    def __init__(self, shape: Shape, rows: int, context: int, max_new: int, device, dtype,
                 compiled: bool = False, seed: int = 0):
        import torch

        # Compiled: one layer's function (shared by every layer, symbolic sizes) and the head,
        # each by torch.compile, whose fused kernels stand in for vLLM's fused ones.
        self.layer = torch.compile(decoder_layer, dynamic=True) if compiled else decoder_layer
        self.head = torch.compile(decoder_head, dynamic=True) if compiled else decoder_head

        s = shape
        gen = torch.Generator(device=device).manual_seed(seed)

        def w(*size):
            return (torch.randn(*size, generator=gen, device=device, dtype=dtype)
                    / math.sqrt(size[0]))

        d, q_out, kv_out = s.head_dim, s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.shape, self.context, self.dtype = s, context, dtype
        self.embed = w(s.vocab, s.hidden)
        self.lm_head = w(s.hidden, s.vocab)
        self.layers = [dict(qkv=w(s.hidden, q_out + 2 * kv_out),
                            qkv_bias=torch.zeros(q_out + 2 * kv_out, device=device, dtype=dtype),
                            o=w(q_out, s.hidden), gate_up=w(s.hidden, 2 * s.intermediate),
                            down=w(s.intermediate, s.hidden),
                            norm1=torch.ones(s.hidden, device=device, dtype=dtype),
                            norm2=torch.ones(s.hidden, device=device, dtype=dtype))
                       for _ in range(s.layers)]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        total = context + max_new
        # Grouped KV heads, as stored: [rows, kv_heads, total, head_dim] per layer.
        self.k = [torch.randn(rows, s.kv_heads, total, d, generator=gen, device=device,
                              dtype=dtype) for _ in range(s.layers)]
        self.v = [torch.randn_like(k) for k in self.k]
        inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        angles = torch.arange(total, device=device, dtype=torch.float32)[:, None] * inv[None]
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, ids, mask):
        """ids [R, t] int64; mask [t, context + t] bool (True: attend), or None. Returns
        [R, t, V]."""
        s, c = self.shape, self.context
        t = ids.shape[1]
        cos = self.cos[c:c + t].repeat(1, 2)
        sin = self.sin[c:c + t].repeat(1, 2)
        x = self.embed[ids]  # [R, t, h]
        for i, p in enumerate(self.layers):
            x = self.layer(x, p, self.k[i], self.v[i], cos, sin, mask, c, s.heads, s.kv_heads)
        return self.head(x, self.norm, self.lm_head)


def decoder_layer(x, p, k_cache, v_cache, cos, sin, mask, c: int, heads: int, kv_heads: int):
    """One Qwen2 layer over x [R, t, h] at positions c..c+t, its K and V written into the
    caches [rows, kv_heads, total, d]."""
    import torch.nn.functional as F

    R, t, _ = x.shape
    d = k_cache.shape[-1]
    h = _rms(x, p["norm1"])
    qkv = h @ p["qkv"] + p["qkv_bias"]
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q = _rope(q.view(R, t, heads, d).transpose(1, 2), cos, sin)
    k_cache[:R, :, c:c + t] = _rope(k.view(R, t, kv_heads, d).transpose(1, 2), cos, sin)
    v_cache[:R, :, c:c + t] = v.view(R, t, kv_heads, d).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, k_cache[:R, :, :c + t], v_cache[:R, :, :c + t],
                                       attn_mask=mask, enable_gqa=True)
    x = x + a.transpose(1, 2).reshape(R, t, heads * d) @ p["o"]
    gate, up = (_rms(x, p["norm2"]) @ p["gate_up"]).chunk(2, dim=-1)
    return x + (F.silu(gate) * up) @ p["down"]


def decoder_head(x, norm, lm_head):
    return _rms(x, norm) @ lm_head


def _rope(x, cos, sin):
    """Rotate-half rotary embedding of x [R, heads, t, d] (cos, sin [t, d])."""
    import torch

    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def _rms(x, weight, eps: float = 1e-6):
    import torch

    var = x.to(torch.float32).pow(2).mean(dim=-1, keepdim=True)
    return (x.to(torch.float32) * torch.rsqrt(var + eps)).to(x.dtype) * weight


def causal_mask(context: int, t: int, device):
    """[t, context + t] bool, new token i sees the context and new tokens up to i; None for one
    token (it sees everything), so that attention may take a kernel without masks."""
    import torch

    if t == 1:
        return None
    cols = torch.arange(context + t, device=device)
    return cols[None, :] <= (context + torch.arange(t, device=device))[:, None]


def time_forward(model: Decoder, rows: int, t: int, device, repeats: int, budget_s: float
                 ) -> dict:
    """Median and [min, max] ms of one forward of ``rows`` × ``t`` tokens (a graph replay on
    CUDA; eager elsewhere)."""
    import torch

    ids = torch.randint(0, model.shape.vocab, (rows, t), device=device)
    mask = causal_mask(model.context, t, device)
    call = lambda: model.forward(ids, mask)  # noqa: E731
    if device.type == "cuda":
        graph, out = capture(call, warmups=2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(out.float()).all(), "the forward's logits are not finite"
        call = graph.replay
    once = clock(call, device, 1)
    n = max(1, min(200, int(budget_s / max(once, 1e-6) / repeats)))
    times = [clock(call, device, n) * 1e3 for _ in range(repeats)]
    return {"ms": statistics.median(times), "ms_min": min(times), "ms_max": max(times),
            "calls": n}


def main(argv=None) -> None:
    import platform

    import torch

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tiny", action="store_true", help="small shapes (tests, CPU)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--batches", default="1,4,16,64", help="target: requests per pass")
    ap.add_argument("--tokens", default="1,5,9", help="target: tokens per request (γ + 1)")
    ap.add_argument("--rows", default="1,4,16,64,128,256", help="draft: rows per forward")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of timed calls a shape")
    ap.add_argument("--modes", default=None,
                    help="plain (PyTorch's kernels, one per operation) and/or compiled (one "
                         "layer's function by torch.compile); default both on CUDA, plain "
                         "elsewhere")
    ap.add_argument("--out", default=None)
    ap.add_argument("--project", action="store_true",
                    help="no timing: the projection from --out's forwards.json")
    ap.add_argument("--core", default="benchmarks/reports/core-gpu-h200/core_kernels.json")
    ap.add_argument("--acceptance", default="benchmarks/reports/acceptance-cpu/acceptance.json")
    args = ap.parse_args(argv)
    if args.project:
        return project(args)
    device = torch.device(args.device)
    args.modes = args.modes or ("compiled,plain" if device.type == "cuda" else "plain")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target_shape, draft_shape = (TINY_TARGET, TINY_DRAFT) if args.tiny else (TARGET, DRAFT)
    batches = [int(v) for v in args.batches.split(",")]
    tokens = [int(v) for v in args.tokens.split(",")]
    rows_list = [int(v) for v in args.rows.split(",")]
    modes = args.modes.split(",")
    env = {**cpu_model_and_flags(), "torch": torch.__version__, "device": str(device),
           "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
           "cuda": torch.version.cuda, "dtype": str(dtype).replace("torch.", ""),
           "machine": platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "graphs": device.type == "cuda"}
    shapes = {s.name: {**s.__dict__, "parameters": s.parameters()}
              for s in (target_shape, draft_shape)}
    columns = [("mode", "mode"), ("model", "model"), ("batch", "requests or rows"),
               ("tokens_each", "tokens each"), ("tokens", "tokens"), ("ms", "ms (median)"),
               ("ms_min", "min"), ("ms_max", "max")]
    rows = []

    def save(complete: bool):  # after every shape: a run stopped by a time limit keeps its rows
        return write_outputs("forwards", {
            "benchmark": "forwards", "args": vars(args), "shapes": shapes, "environment": env,
            "complete": complete, "rows": rows}, markdown_table(rows, columns), args.out)

    def measure(mode, model, name, shape, batch, t):
        started = time.perf_counter()
        try:
            timing = time_forward(model, batch, t, device, args.repeats, args.budget)
        except Exception as exc:  # a mode that fails (a compiler error): say so, go on
            timing = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rows.append({"mode": mode, "model": name, "shape": shape.name, "batch": batch,
                     "tokens_each": t, "tokens": batch * t, **timing,
                     "seconds": time.perf_counter() - started})
        print(f"{mode} {name} {batch}x{t}: {timing.get('ms', timing.get('error'))}", flush=True)
        save(False)

    with torch.inference_mode():
        for mode in modes:
            compiled = mode == "compiled"
            target = Decoder(target_shape, max(batches), args.context, max(tokens), device,
                             dtype, compiled)
            for b in batches:
                for t in tokens:
                    measure(mode, target, "target", target_shape, b, t)
            del target
            draft = Decoder(draft_shape, max(rows_list), args.context, 1, device, dtype,
                            compiled)
            for r in rows_list:
                measure(mode, draft, "draft", draft_shape, r, 1)
            del draft
    out = save(True)
    table = markdown_table(rows, columns)
    print(table)
    print(f"\nwrote {out}/forwards.json, forwards.md")


def assumptions(parts) -> dict:
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


def project(args) -> None:
    import json
    from pathlib import Path

    from benchmarks.lib.projection import (MeasuredParts, forwards_mode, measured_projection,
                                           t0_tokens_per_pass)

    out = Path(args.out) if args.out else None
    forwards = json.loads(((out or Path("benchmarks/results")) / "forwards.json").read_text())
    core = json.loads(Path(args.core).read_text())
    acceptance = json.loads(Path(args.acceptance).read_text())
    mode = forwards_mode(forwards)
    parts = MeasuredParts.from_reports(forwards, core, mode)
    rows = measured_projection(t0_tokens_per_pass(acceptance), parts)
    checks = assumptions(parts)
    heads = [k for k in rows[0] if k.startswith(("step", "vs"))]
    lines = ["| rule | W | γ | tokens / pass | " + " | ".join(heads) + " |",
             "|---" * (4 + len(heads)) + "|"]
    for r in sorted(rows, key=lambda r: (r["g"], r["config"])):
        lines.append(f"| {r['config']} | {r['w']} | {r['g']} | {r['tokens_per_pass']:.2f} | "
                     + " | ".join(f"{r[h]:.2f}" for h in heads) + " |")
    for name, values in checks.items():
        lines += ["", f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items())]
    table = "\n".join(lines)
    where = write_outputs("projection", {
        "benchmark": "forwards projection", "forwards_mode": mode,
        "forwards_environment": forwards["environment"],
        "core_environment": core["environment"], "core": args.core,
        "acceptance": args.acceptance, "assumptions": checks, "rows": rows}, table, out)
    print(table)
    print(f"\nwrote {where}/projection.json, projection.md")


if __name__ == "__main__":
    main()
