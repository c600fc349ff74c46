"""The one registry of what the benchmarks compare: configurations, the engines they run on, and
the equal-sampler switch. Two ways to name a configuration, one per kind of question:

- *named* (``CONFIGS``, benchmarks.speed's verdict and study): a name per configuration, engines
  built by :class:`EngineSet`, set up by :func:`prepare`;
- *the rules' grid* (:func:`configurations`: benchmarks.acceptance, benchmarks.quality's
  ``rules`` and benchmarks.speed's ``rules``): per temperature and γ, vLLM SD, MTAD "exact",
  FLy (a baseline: the lossy peer, vllm_mtad.worker_rpc.use_baseline_rule) and MTAD W=...,
  each a dict, engines built by :func:`build`, set up by :func:`prepare_rule`.

An *engine* is one vLLM ``LLM`` (in this process); a *configuration* is what a timed run asks of
one: the target alone, vLLM's own speculative decoding (``draft_model``, standard rejection
sampling), or MTAD: the default (adaptive policy, W <= 4, γ <= 8, what the README tells a user
to set), a forced arm ``mtad_w{W}g{γ}`` on an MTAD engine of its own (so that the default's
engine serves default requests only), or ``mtad_fixed`` (W=4, γ=4 forced on the default's
engine, which then learns from those steps too: what earlier verdicts ran). Forced arms go
through vllm_mtad.worker_rpc.force_plans.

**Equal samplers.** On CPU vLLM's top-k/top-p sorts the whole vocabulary, and MTAD's engine
selects instead; a comparison at T=1 with top-k/top-p then measures the sampler as much as the
method. With ``equal`` (the default of every program here) every engine draws top-k/top-p by the
same k-selection (patches/worker/patch_topk_topp_sampler.py, VLLM_MTAD_CPU_TOPK_SELECT: the
same tokens as vLLM's sort). A configuration named ``<name> as shipped`` runs the same engine
with vLLM's own sampler, so both ratios come from one run.

The engine helpers the programs share with the tests (devtools/engine.py: ``build_llm``,
``mtad_spec``, ``draft_model_spec``, ``close``, ``release_memory``, ``default_dtype``,
``metric_sum``) are named here too: programs take them from this module, not from devtools.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from benchmarks.lib.prompts import PAPER
from devtools.engine import (build_llm, close, default_dtype, draft_model_spec,  # noqa: F401
                             metric_sum, mtad_spec, release_memory)

SHIPPED = " as shipped"  # the suffix of a configuration run with vLLM's own sampler

# name -> what a run of it measures (engine_of says which engine it runs on)
CONFIGS = {
    "target": "the target alone",
    "vllm_sd": "vLLM draft_model, probabilistic drafts, rejection sampling",
    "vllm_sd_greedy": "vLLM draft_model, greedy drafts",
    "mtad": "MTAD, the default (adaptive policy, W <= 4, gamma <= 8)",
    "mtad_fixed": "MTAD, W=4 and gamma=4 every step, on the default's engine",
    "mtad_w1g4": "MTAD, W=1 and gamma=4 every step, on an engine of its own",
    "mtad_w4g4": "MTAD, W=4 and gamma=4 every step, on an engine of its own",
    "mtad_w1g8": "MTAD, W=1 and gamma=8 every step, on an engine of its own",
    "mtad_w4g8": "MTAD, W=4 and gamma=8 every step, on an engine of its own",
}


def forced_arm(config: str) -> tuple[int, int] | None:
    """(W, γ) a configuration forces on every step (None: the adaptive policy)."""
    base = config.removesuffix(SHIPPED).split(" ")[0]
    if base == "mtad_fixed":
        return (4, 4)
    if base.startswith("mtad_w"):
        width, gamma = base.removeprefix("mtad_w").split("g")
        return int(width), int(gamma)
    return None


def engine_of(config: str) -> str:
    """The engine a configuration runs on: "target", "sd", "sd_greedy", "mtad" (the default
    and mtad_fixed) or "mtad_forced" (the forced arms mtad_w*)."""
    base = config.removesuffix(SHIPPED).split(" ")[0]
    if base.startswith("mtad_w"):
        return "mtad_forced"
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
    gamma: int = 4  # vLLM SD's γ
    long_gamma: int = 8  # the MTAD engines' γ: the default's bound, the forced arms' room

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
        """A fresh engine ("target", "sd", "sd_greedy", "mtad" or "mtad_forced", whose γ is
        ``mtad_gamma``, default ``long_gamma``)."""
        if engine == "target":
            return build_llm(self.target, None, **self.common())
        # Acceptance per engine (vLLM's global counters belong to the engine built last, and
        # several are alive here): per-request metrics, which vLLM allows with speculative
        # decoding only.
        kw = {**self.common(), "per_request_spec_decode_metrics": "summary"}
        if engine in ("mtad", "mtad_forced"):
            return build_llm(self.target, mtad_spec(
                self.draft, gamma=mtad_gamma or self.long_gamma,
                speculation_policy="adaptive"), **kw)
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


def prepare(llm, config: str) -> dict:
    """Set ``llm`` up for a run of ``config``: the sampler (vLLM's own for ``... as
    shipped``, the selection otherwise) and, on an MTAD engine, the arm it forces (none: the
    adaptive policy, up to the engine's γ). Returns the selection's counts so far (see
    :func:`selection_counts`)."""
    from vllm_mtad.worker_rpc import use_selection

    counts = llm.collective_rpc(use_selection, args=(not config.endswith(SHIPPED),))[0]
    if engine_of(config).startswith("mtad"):
        from vllm_mtad.worker_rpc import force_plans

        arm = forced_arm(config)
        llm.collective_rpc(force_plans(None if arm is None else [arm]))
    return counts


def selection_counts(llm) -> dict:
    """{"selected", "fallbacks"}: the sampling calls of ``llm``'s worker that took the
    k-selection, and those that went to vLLM's sort with the switch on (for the record: a run
    on equal samplers that fell back is not on equal samplers)."""
    from vllm_mtad.worker_rpc import counts

    return llm.collective_rpc(counts)[0]


def select_everywhere() -> None:
    """The equal-sampler switch, on, for this process's engines (read at every sampling call)
    and for worker processes it starts from now on (they inherit the environment)."""
    os.environ["VLLM_MTAD_CPU_TOPK_SELECT"] = "1"


# The rules' grid: configurations as dicts (name, engine, t, g, w, mode, rule, adaptive).


def configurations(temperatures, gammas, widths, adaptive: bool = False) -> list[dict]:
    """Every configuration of the rules' grid: name, engine, temperature, γ, W, request mode,
    rule. FLy is the configuration with ``rule="fly"``: the same drafts as MTAD W=1, FLy's
    acceptance."""
    out = []
    for t in temperatures:
        for g in gammas:
            sd = "vllm_sd_greedy" if t == 0 else "vllm_sd"
            out.append(dict(name=f"{sd} g{g} T{t:g}", engine=f"{sd}:{g}", t=t, g=g, w=1))
            if t == 0:
                out.append(dict(name=f"mtad_exact w1 g{g} T0", engine="mtad", t=t, g=g, w=1,
                                mode="exact"))
            out.append(dict(name=f"fly g{g} T{t:g}", engine="mtad", t=t, g=g, w=1,
                            mode="exact", rule="fly"))  # (the mode is read at T = 0 only)
            out += [dict(name=f"mtad w{w} g{g} T{t:g}", engine="mtad", t=t, g=g, w=w,
                         mode="joint") for w in widths]
    if adaptive:  # bounds: the largest W and γ of the grid
        out += [dict(name=f"mtad_adaptive w{max(widths)} g{max(gammas)} T{t:g}",
                     engine="mtad_adaptive", t=t, g=max(gammas), w=max(widths), mode="joint",
                     adaptive=True) for t in temperatures]
    return out


def engine_dtype(args, tiny: bool) -> str:
    """The dtype :func:`build` gives an engine: float32 for the tiny pair, else ``--dtype``."""
    return "float32" if tiny else args.dtype


def build(engine: str, args, target: str, draft: str, tiny: bool, log_stats: bool = False):
    """One engine of the rules' grid (``log_stats``: vLLM keeps each request's timestamps)."""
    common = dict(dtype=engine_dtype(args, tiny), max_model_len=2048,
                  max_num_seqs=args.batch, max_num_batched_tokens=4096, block_size=32,
                  kv_cache_bytes=(256 << 20) if tiny else getattr(args, "kv_bytes", 1 << 30),
                  enable_prefix_caching=False, per_request_spec_decode_metrics="summary",
                  disable_log_stats=not log_stats)
    if engine == "target":  # the target alone (the rules' quality baseline)
        common.pop("per_request_spec_decode_metrics")
        return build_llm(target, None, **common)
    if engine in ("mtad", "mtad_adaptive"):
        policy = "adaptive" if engine == "mtad_adaptive" else "fixed"
        spec = mtad_spec(draft, gamma=max(args.gammas), width=max(args.widths),
                         beam_kv_fraction=0.5, speculation_policy=policy)
        return build_llm(target, spec, **common)
    kind, gamma = engine.split(":")
    extra = {"draft_sample_method": "greedy"} if kind == "vllm_sd_greedy" else {}
    return build_llm(target, draft_model_spec(draft, int(gamma), **extra), **common)


def prepare_rule(llm, config: dict) -> None:
    """Set the MTAD engine up for a grid ``config``: every step's (W, γ) (or the policy's) and
    the rule (FLy's, the baseline, or MTAD's)."""
    if config["engine"] in ("mtad", "mtad_adaptive"):
        from vllm_mtad.sampler import FlyRule
        from vllm_mtad.worker_rpc import force_plans, use_baseline_rule

        llm.collective_rpc(force_plans(None if config.get("adaptive")
                                       else [(config["w"], config["g"])]))
        llm.collective_rpc(use_baseline_rule(FlyRule() if config.get("rule") else None))


def sampling_params(config: dict, n: int, max_tokens: int, stop=None, ignore_eos=False,
                    seed: int = 1000) -> list:
    """One request's parameters per prompt (seed ``seed`` + prompt) for a grid ``config``: the
    paper's top-k 10, top-p 0.9 at T > 0, greedy at T = 0 with the configuration's greedy
    rule."""
    from vllm import SamplingParams

    sampling = PAPER if config["t"] > 0 else {"temperature": 0.0}
    extra = {"greedy_acceptance": config["mode"]} if config["t"] == 0 and "mode" in config \
        else None
    return [SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, seed=seed + i,
                           stop=stop, extra_args=extra, **sampling) for i in range(n)]
