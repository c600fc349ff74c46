"""Decoder shapes (the models' config.json), for the GPU forwards (benchmarks.kernels forwards)
and the projection built on them (benchmarks/lib/projection.py). No torch.

A shard of a target split by tensor parallelism over ``tp`` GPUs keeps the hidden size and the
layers and divides the query and KV heads, the MLP width and the vocabulary (vLLM's
column/row-parallel layers and its vocabulary-parallel embedding and lm_head); the all-reduces
between the shards are not part of a shard's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Shape:
    """A Llama/Qwen2 decoder's shapes; ``tied``: the lm_head is the embedding table."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 151_936
    tied: bool = False
    head_dim_: int | None = None  # None: hidden // heads (a shard keeps the whole model's)

    @property
    def head_dim(self) -> int:
        return self.head_dim_ or self.hidden // self.heads

    def layer_parameters(self) -> int:
        h, d = self.hidden, self.head_dim
        attn = h * (self.heads + 2 * self.kv_heads) * d + self.heads * d * h
        return self.layers * (attn + 3 * h * self.intermediate)

    def parameters(self) -> int:
        return self.layer_parameters() + (1 if self.tied else 2) * self.vocab * self.hidden

    def bytes_read(self, bytes_per_value: int = 2) -> int:
        """What one decoding forward reads of the weights: every layer and the lm_head (the
        embedding is looked up, a few rows)."""
        return bytes_per_value * (self.layer_parameters() + self.vocab * self.hidden)

    def shard(self, tp: int) -> "Shape":
        """One GPU's part at tensor parallelism ``tp``."""
        for field in ("heads", "kv_heads", "intermediate", "vocab"):
            if getattr(self, field) % tp:
                raise ValueError(f"{self.name}: {field} {getattr(self, field)} does not split "
                                 f"over tp={tp}")
        return replace(self, name=f"{self.name} / TP={tp}", heads=self.heads // tp,
                       kv_heads=self.kv_heads // tp, intermediate=self.intermediate // tp,
                       vocab=self.vocab // tp, head_dim_=self.head_dim)

    def scaled(self, factor: int) -> "Shape":
        """The same layout with every size divided by ``factor`` (at least one head, a head
        at least 2 wide, query heads a multiple of the KV heads): what a CPU runs to prove
        the code of a deployed shape."""
        if factor == 1:
            return self

        def div(v, least=1):
            return max(v // factor, least)

        kv = div(self.kv_heads)
        return replace(self, name=f"{self.name} / {factor}", hidden=div(self.hidden, 2),
                       layers=div(self.layers), heads=max(div(self.heads) // kv, 1) * kv,
                       kv_heads=kv, intermediate=div(self.intermediate), vocab=div(self.vocab),
                       head_dim_=div(self.head_dim, 4) // 2 * 2)


# The real pair (measured on the H200: benchmarks/reports/forwards-gpu-h200).
QWEN_CODER_1_5B = Shape("Qwen2.5-Coder-1.5B", 1536, 28, 12, 2, 8960)
QWEN_CODER_0_5B = Shape("Qwen2.5-Coder-0.5B", 896, 24, 14, 2, 4864, tied=True)
# Small shapes for the CPU tests.
TINY_TARGET = Shape("tiny target", 64, 2, 4, 2, 128, vocab=512)
TINY_DRAFT = Shape("tiny draft", 32, 2, 4, 2, 64, vocab=512)
# Where users deploy (config.json of each; not yet measured).
LLAMA_3_1_8B = Shape("Llama-3.1-8B", 4096, 32, 32, 8, 14336, vocab=128_256)
LLAMA_3_1_70B = Shape("Llama-3.1-70B", 8192, 80, 64, 8, 28672, vocab=128_256)
QWEN_2_5_32B = Shape("Qwen2.5-32B", 5120, 64, 40, 8, 27648, vocab=152_064)
QWEN_2_5_0_5B = Shape("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, tied=True)
LLAMA_3_2_1B = Shape("Llama-3.2-1B", 2048, 16, 32, 8, 8192, vocab=128_256, tied=True)

# (target, draft) as deployed: a draft shares its target's tokenizer, so Llama with Llama.
DEPLOYED = {"8B/1B": (LLAMA_3_1_8B, LLAMA_3_2_1B),
            "32B/0.5B": (QWEN_2_5_32B, QWEN_2_5_0_5B),
            "70B-TP4/1B": (LLAMA_3_1_70B.shard(4), LLAMA_3_2_1B)}
REAL_PAIR = ("1.5B/0.5B", (QWEN_CODER_1_5B, QWEN_CODER_0_5B))
