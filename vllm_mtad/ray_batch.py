"""Offline batch generation with MTAD on a Ray cluster: one vLLM engine per Ray actor.

    python -m vllm_mtad.ray_batch --target T --draft D --input prompts.jsonl --output out.jsonl \
        --engines 2 [--ray-address auto] [--gpus-per-engine 1] [--gamma 4 --beam-width 4 ...]

Each input line is ``{"prompt": "text"}`` or ``{"prompt_token_ids": [..]}``, optionally with
``"sampling": {SamplingParams fields}`` (temperature, top_k, top_p, seed, max_tokens,
extra_args={"acceptance_threshold": ..}, ...). Each output line is ``{"index", "text",
"token_ids", "finish_reason"}`` in input order. The prompts are split into ``--engines``
contiguous shards, one per actor; every actor holds a whole MTAD engine (``LLM()`` with the
``"mtad"`` speculative config) and runs its shard as one batch. Under the fixed speculation
policy (this command's default, ``--speculation-policy``) a seeded request's output does not
depend on the batch it runs in, so the outputs equal those of one engine over all prompts
(tests/test_ray.py checks it on a local Ray cluster); ``adaptive`` (the engine default) chooses
W and γ by each actor's load and timings, so they may not.

Why actors and not vLLM's Ray executor: vLLM 0.32's CPU platform declares no Ray device
(``ray_device_key = ""``), so ``distributed_executor_backend="ray"`` fails there ("current
platform cpu does not support ray"). On CUDA machines an actor can itself use tensor
parallelism: pass ``--tensor-parallel-size`` and ``--gpus-per-engine`` equal to it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def _engine_actor_cls():
    import ray

    @ray.remote
    class MTADEngine:
        """One vLLM engine with MTAD, in this actor's process."""

        def __init__(self, engine_kwargs: dict[str, Any]):
            from vllm import LLM

            self.llm = LLM(**engine_kwargs)

        def generate(self, prompts: list, params: list[dict]) -> list[dict]:
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            inputs = [TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p
                      for p in prompts]
            outs = self.llm.generate(inputs, [SamplingParams(**p) for p in params],
                                     use_tqdm=False)
            return [{"text": o.outputs[0].text, "token_ids": list(o.outputs[0].token_ids),
                     "finish_reason": o.outputs[0].finish_reason} for o in outs]

    return MTADEngine


def generate(prompts: list, params: list[dict], *, engine_kwargs: dict[str, Any],
             num_engines: int = 1, actor_options: dict[str, Any] | None = None) -> list[dict]:
    """Run ``prompts`` (text, or lists of token ids) with per-prompt SamplingParams fields
    ``params`` on ``num_engines`` Ray actors, each holding one MTAD engine built with
    ``LLM(**engine_kwargs)``. Ray must be initialised (``ray.init(...)``). Returns one dict per
    prompt, in order: text, token_ids, finish_reason."""
    import ray

    if len(prompts) != len(params):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling parameter sets")
    if num_engines < 1:
        raise ValueError(f"num_engines must be >= 1, got {num_engines}")
    options = {"num_cpus": 1, **(actor_options or {})}
    # The engine runs inside the actor's process (no extra engine-core process per actor).
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           **options.pop("runtime_env", {}).get("env_vars", {})}
    cls = _engine_actor_cls().options(runtime_env={"env_vars": env}, **options)
    actors = [cls.remote(engine_kwargs) for _ in range(num_engines)]
    bounds = [len(prompts) * i // num_engines for i in range(num_engines + 1)]
    futures = [actor.generate.remote(prompts[a:b], params[a:b])
               for actor, a, b in zip(actors, bounds, bounds[1:])]
    try:
        return [out for shard in ray.get(futures) for out in shard]
    finally:
        for actor in actors:
            ray.kill(actor)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--input", required=True, help="JSONL, one prompt per line")
    parser.add_argument("--output", required=True, help="JSONL, one result per line")
    parser.add_argument("--engines", type=int, default=1, help="Ray actors, one engine each")
    parser.add_argument("--ray-address", default=None,
                        help="an existing cluster ('auto' after `ray start`); default: local")
    parser.add_argument("--gpus-per-engine", type=float, default=0)
    parser.add_argument("--cpus-per-engine", type=float, default=1)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--speculation-policy", choices=["fixed", "adaptive"], default="fixed",
                        help="fixed (default here): outputs equal one engine's over all prompts")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="no torch.compile / CUDA graphs (as vLLM's --enforce-eager)")
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                        help="KV cache per engine (default: vLLM's own sizing)")
    args = parser.parse_args(argv)

    import ray

    rows = [json.loads(line) for line in open(args.input) if line.strip()]
    prompts = [r["prompt_token_ids"] if "prompt_token_ids" in r else r["prompt"] for r in rows]
    params = [r.get("sampling", {}) for r in rows]
    engine_kwargs = {"model": args.target, "dtype": args.dtype,
                     "tensor_parallel_size": args.tensor_parallel_size,
                     "speculative_config": {"method": "mtad", "model": args.draft,
                                            "num_speculative_tokens": args.gamma,
                                            "beam_width": args.beam_width,
                                            "acceptance_threshold": args.threshold,
                                            "speculation_policy": args.speculation_policy}}
    for key in ("max_model_len", "max_num_seqs", "kv_cache_memory_bytes", "enforce_eager"):
        if getattr(args, key):
            engine_kwargs[key] = getattr(args, key)
    ray.init(address=args.ray_address, include_dashboard=False)
    outs = generate(prompts, params, engine_kwargs=engine_kwargs, num_engines=args.engines,
                    actor_options={"num_cpus": args.cpus_per_engine,
                                   "num_gpus": args.gpus_per_engine})
    with open(args.output, "w") as fh:
        for i, out in enumerate(outs):
            fh.write(json.dumps({"index": i, **out}) + "\n")
    print(f"wrote {len(outs)} results to {args.output}")


if __name__ == "__main__":
    main()
