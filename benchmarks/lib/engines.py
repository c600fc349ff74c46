"""The configurations the speed benchmarks compare, the engines they run on, and the
equal-sampler switch.

An *engine* is one vLLM ``LLM`` (in this process); a *configuration* is what a timed run asks of
one: the target alone, vLLM's own speculative decoding (``draft_model``, standard rejection
sampling), or MTAD with the default adaptive policy, fixed W=4 and γ=4, or the policy bounded
by a longer γ. The MTAD configurations share one engine and differ only in what the policy may
choose (vllm_mtad.policy.controller.force_plans / limit_plans), so they share its measurements.

**Equal samplers.** On CPU vLLM's top-k/top-p sorts the whole vocabulary, and MTAD's engine
selects instead; a comparison at T=1 with top-k/top-p then measures the sampler as much as the
method. With ``equal`` (the default of every program here) every engine draws top-k/top-p by the
same k-selection (patches/worker/patch_topk_topp_sampler.py, VLLM_MTAD_CPU_TOPK_SELECT: the
same tokens as vLLM's sort). A configuration named ``<name> as shipped`` runs the same engine
with vLLM's own sampler, so both ratios come from one run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from devtools.engine import build_llm, draft_model_spec, mtad_spec

SHIPPED = " as shipped"  # the suffix of a configuration run with vLLM's own sampler

# name -> what a run of it measures (engine_of says which engine it runs on)
CONFIGS = {
    "target": "the target alone",
    "vllm_sd": "vLLM draft_model, probabilistic drafts, rejection sampling",
    "vllm_sd_greedy": "vLLM draft_model, greedy drafts",
    "mtad": "MTAD, the default (adaptive policy, W <= 4, gamma <= 4)",
    "mtad_fixed": "MTAD, W=4 and gamma=4 every step",
    "mtad_g8": "MTAD, adaptive policy with gamma <= 8",
}


def engine_of(config: str) -> str:
    """The engine a configuration runs on: "target", "sd", "sd_greedy" or "mtad"."""
    base = config.removesuffix(SHIPPED).split(" ")[0]
    if base.startswith("mtad"):
        return "mtad"
    return {"target": "target", "vllm_sd": "sd", "vllm_sd_greedy": "sd_greedy"}[base]


@dataclass(frozen=True)
class EngineSet:
    """How to build the engines of a run: everything picklable, so that a repeat can build
    its own in a process of its own."""

    target: str
    draft: str
    tiny: bool
    max_num_seqs: int
    dtype: str = "bfloat16"  # of the real pair (the tiny pair runs in float32)
    gamma: int = 4
    long_gamma: int = 8  # the γ bound of mtad_g8 (its engine is built with this γ)

    def common(self) -> dict:
        return dict(
            dtype="float32" if self.tiny else self.dtype, max_model_len=2048,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=4096, block_size=32,
            kv_cache_bytes=self.kv_bytes(), disable_log_stats=False,
            # Timed repeats reuse their prompts: with prefix caching a configuration's first
            # run would pay the prefill and later ones not (measured: 14.8 s vs 9.6 s).
            enable_prefix_caching=False)

    def kv_bytes(self) -> int:
        return (256 << 20) if self.tiny else (640 << 20)

    def memory_bytes(self, engines: list[str]) -> int:
        """What ``engines`` alive at once take: their weights at this dtype and their KV."""
        target = weights_bytes(self.target, self.common()["dtype"])
        draft = weights_bytes(self.draft, self.common()["dtype"])
        return sum(target + (draft if e != "target" else 0) + self.kv_bytes()
                   for e in engines)

    def build(self, engine: str, mtad_gamma: int | None = None):
        """A fresh engine ("target", "sd", "sd_greedy" or "mtad", whose γ is ``mtad_gamma``,
        default ``gamma``)."""
        if engine == "target":
            return build_llm(self.target, None, **self.common())
        # Acceptance per engine (vLLM's global counters belong to the engine built last, and
        # several are alive here): per-request metrics, which vLLM allows with speculative
        # decoding only.
        kw = {**self.common(), "per_request_spec_decode_metrics": "summary"}
        if engine == "mtad":
            return build_llm(self.target, mtad_spec(
                self.draft, gamma=mtad_gamma or self.gamma, speculation_policy="adaptive"), **kw)
        greedy = {"draft_sample_method": "greedy"} if engine == "sd_greedy" else {}
        return build_llm(self.target, draft_model_spec(self.draft, self.gamma, **greedy), **kw)


def weights_bytes(model_dir: str, dtype: str) -> int:
    """A model's weights in memory at ``dtype``: its safetensors files' size, scaled from the
    dtype they are stored in (config.json's)."""
    import json
    from pathlib import Path

    folder = Path(model_dir)
    stored = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    stored_dtype = config.get("torch_dtype") or config.get("dtype") or "float32"
    size = {"float32": 4, "bfloat16": 2, "float16": 2}
    return stored * size.get(dtype, 4) // size.get(stored_dtype, 4)


def prepare(llm, config: str, gamma: int) -> dict:
    """Set ``llm`` up for a run of ``config``: the sampler (vLLM's own for ``... as
    shipped``, the selection otherwise) and, on the MTAD engine, what the policy may choose.
    Returns the selection's counts so far (see :func:`selection_counts`)."""
    from vllm_mtad.patches.worker.patch_topk_topp_sampler import use_selection

    counts = llm.collective_rpc(use_selection, args=(not config.endswith(SHIPPED),))[0]
    base = config.removesuffix(SHIPPED).split(" ")[0]
    if engine_of(config) == "mtad":
        from vllm_mtad.policy.controller import force_plans, limit_plans

        llm.collective_rpc(force_plans([(4, gamma)] if base == "mtad_fixed" else None))
        llm.collective_rpc(limit_plans(None if base == "mtad_g8" else gamma))
    return counts


def selection_counts(llm) -> dict:
    """{"selected", "fallbacks"}: the sampling calls of ``llm``'s worker that took the
    k-selection, and those that went to vLLM's sort with the switch on (for the record: a run
    on equal samplers that fell back is not on equal samplers)."""
    from vllm_mtad.patches.worker.patch_topk_topp_sampler import counts

    return llm.collective_rpc(counts)[0]


def select_everywhere() -> None:
    """The equal-sampler switch, on, for this process's engines (read at every sampling call)
    and for worker processes it starts from now on (they inherit the environment)."""
    os.environ["VLLM_MTAD_CPU_TOPK_SELECT"] = "1"
