"""A plain PyTorch decoder (Llama/Qwen2 layout: RMSNorm, rotary, grouped-KV attention by
``scaled_dot_product_attention`` on a KV cache, SwiGLU) of any ``benchmarks.lib.shapes.Shape``,
with random weights, and how one of its forwards is timed: a CUDA graph replay on a GPU, eager
elsewhere. For benchmarks.kernels forwards; no vLLM (it runs on a GPU machine without it).
"""

from __future__ import annotations

import math
import statistics

from benchmarks.lib.graphs import capture, clock
from benchmarks.lib.shapes import Shape

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
        # Tied (the small drafts): the lm_head is the embedding table, as stored.
        self.lm_head = self.embed.t() if s.tied else w(s.hidden, s.vocab)
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


# PyTorch's attention kernels by the operator scaled_dot_product_attention dispatches to.
KERNELS = {"_scaled_dot_product_flash_attention": "flash",
           "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
           "_scaled_dot_product_efficient_attention": "memory-efficient",
           "_scaled_dot_product_cudnn_attention": "cuDNN",
           "_scaled_dot_product_attention_math": "math (unfused)"}


def attention_kernel(model: Decoder, rows: int, t: int, mask) -> str:
    """The kernel scaled_dot_product_attention takes in ``model``'s first layer for ``rows``
    × ``t`` new tokens with ``mask`` (read off the operator it dispatches to, once, eager)."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    s, c, dev = model.shape, model.context, model.k[0].device
    q = torch.zeros(rows, s.heads, t, s.head_dim, device=dev, dtype=model.dtype)
    k, v = model.k[0][:rows, :, :c + t], model.v[0][:rows, :, :c + t]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    ops = {e.key.removeprefix("aten::") for e in prof.key_averages()}
    found = [name for op, name in KERNELS.items() if op in ops]
    return ", ".join(found) or "unknown: " + ", ".join(sorted(o for o in ops if "attention" in o))


def time_forward(model: Decoder, rows: int, t: int, device, repeats: int, budget_s: float,
                 masked: bool = True) -> dict:
    """Median and [min, max] ms of one forward of ``rows`` × ``t`` tokens (a graph replay on
    CUDA; eager elsewhere), and the attention kernel it ran. ``masked``: the causal mask over
    the new tokens (what a verification needs); False: no mask, every new token sees all of
    them (the same reads and products, the wrong answer: what a kernel that needs no boolean
    mask, flash with a bottom-right causal mask as vLLM's, would cost)."""
    import torch

    ids = torch.randint(0, model.shape.vocab, (rows, t), device=device)
    mask = causal_mask(model.context, t, device) if masked else None
    kernel = attention_kernel(model, rows, t, mask)
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
            "calls": n, "attention": kernel}
