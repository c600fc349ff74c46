"""KV cost per request: how many requests run at once at one fixed KV budget.

    python -m benchmarks.kv_cost            # the issue's workload on the tiny pair, ~3 minutes
    python -m benchmarks.kv_cost --quick    # a smaller smoke run, ~30 s

One workload (fixed prompts, greedy, ``ignore_eos``), one KV budget (``kv_cache_memory_bytes``),
one ``max_num_seqs``; for the target alone, vLLM's speculative decoding with the same draft, and
MTAD at several beam widths. Each engine's requests go through ``LLMEngine.step()`` one step at a
time and vLLM's own gauges and counters are read after every step: the peak and mean of
``vllm:num_requests_running``, the preemptions (``vllm:num_preemptions``). Also per engine: the
lookahead slots the scheduler reserves per request (``num_lookahead_tokens``, in *every* layer,
the target's included), the blocks of the shared pool, and the draft-only bytes MTAD keeps for
the beams (``draft_scratch_bytes``), the batch rows they hold tails for (the rest draft one
beam; ``beam_kv_fraction``, ``--beam-kv-fractions``) and the acceptance length. Tiny pair in
float32: the draft holds 3 of the 7 layers' KV per token. Writes ``kv_cost.json`` and ``kv_cost.md`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time

from benchmarks.lib.engines import build_llm, close, metric_sum, mtad_spec
from benchmarks.lib.report import environment, markdown_table, write_outputs

GAMMA = 4
TAU = 0.5


def workload(num_requests: int, prompt_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(prompt_len)] for _ in range(num_requests)]


def gauges(llm) -> tuple[float, float]:
    return (metric_sum(llm, "vllm:num_requests_running"),
            metric_sum(llm, "vllm:num_preemptions"))


def drafter_numbers(llm) -> dict:
    """The draft-only bytes, the batch rows they hold beam tails for, and the share of drafted
    rows that found no room and drafted one beam (driver rank's counters)."""
    from vllm_mtad.worker_rpc import drafter_stats

    stats = llm.collective_rpc(drafter_stats)
    first = stats[0]
    return {"draft_scratch_bytes": int(sum(s.get("draft_scratch_bytes", 0) for s in stats)),
            "beam_rows": first.get("draft_scratch_rows", 0),
            "narrowed_share": first.get("narrowed_rows", 0) / max(first.get("rows", 0), 1)}


def acceptance_length(llm) -> float:
    """1 + accepted / drafts, from vLLM's spec-decode counters."""
    drafts = metric_sum(llm, "vllm:spec_decode_num_drafts")
    return 1 + metric_sum(llm, "vllm:spec_decode_num_accepted_tokens") / max(drafts, 1)


def run_one(target: str, spec: dict | None, prompts, new_tokens: int, kv_bytes: int,
            max_num_seqs: int, block_size: int, max_model_len: int) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = build_llm(target, spec, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                    block_size=block_size, kv_cache_bytes=kv_bytes, disable_log_stats=False)
    config = llm.llm_engine.vllm_config
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), TokensPrompt(prompt_token_ids=prompt), params)
    peak, samples, steps, outputs = 0.0, [], 0, {}
    started = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        running, preempted = gauges(llm)
        peak = max(peak, running)
        samples.append(running)
        steps += 1
    seconds = time.perf_counter() - started
    row = {"peak_running": int(peak), "mean_running": sum(samples) / max(1, len(samples)),
           "preemptions": int(preempted), "steps": steps, "seconds": seconds,
           "output_tokens": sum(len(v) for v in outputs.values()),
           "finished": len(outputs),
           "lookahead_slots": config.num_lookahead_tokens,
           "pool_blocks": config.cache_config.num_gpu_blocks,
           **({"acceptance_length": acceptance_length(llm)} if spec else {}),
           **(drafter_numbers(llm) if spec and spec["method"] == "mtad" else
              {"draft_scratch_bytes": 0}),
           "outputs": [outputs[str(i)] for i in range(len(prompts))]}
    del engine
    close(llm)
    return row


def main(argv=None):
    # Set before torch and vLLM are first imported (below, in the functions this calls).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="16 requests of 48 + 32 tokens, 6 MiB, max_num_seqs 8, W = 1, 4")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--kv-mib", type=float, default=24.0)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=1024,
                        help="vLLM caps the lookahead at max_model_len: a value close to the "
                             "workload's length hides the cost of a large lookahead")
    parser.add_argument("--widths", default="1,2,4,8")
    parser.add_argument("--beam-kv-fractions", default="0.1",
                        help="MTAD's beam_kv_fraction, one engine per value and W > 1")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.prompt_tokens, args.new_tokens = 16, 48, 32
        args.kv_mib, args.max_num_seqs, args.widths = 6.0, 8, "1,4"

    from tqdm import tqdm

    from benchmarks.lib.models import TinyPairSpec, build_tiny_pair
    from vllm_mtad import envs

    target, draft = (str(p) for p in build_tiny_pair(envs.cache_dir() / "tiny"))
    prompts = workload(args.requests, args.prompt_tokens, TinyPairSpec().vocab_size)
    kv_bytes = int(args.kv_mib * (1 << 20))
    sd = {"method": "draft_model", "model": draft, "num_speculative_tokens": GAMMA}
    fractions = [float(x) for x in args.beam_kv_fractions.split(",")]
    plan = [("target alone", None), ("vLLM SD", sd)] + [
        (f"MTAD W={w}" + (f", beam_kv_fraction {f}" if len(fractions) > 1 and w > 1 else ""),
         mtad_spec(draft, GAMMA, w, TAU, beam_kv_fraction=f))
        for w in (int(x) for x in args.widths.split(","))
        for f in (fractions if w > 1 else fractions[:1])]
    rows = []
    for name, spec in tqdm(plan, desc="engines", unit="engine"):
        try:
            row = run_one(target, spec, prompts, args.new_tokens, kv_bytes, args.max_num_seqs,
                          args.block_size, args.max_model_len)
        except Exception as err:  # an engine that cannot start at this budget is a result too
            row = {"error": str(err).splitlines()[0][:300]}
            gc.collect()
        rows.append({"name": name, **row})
    base = next(r for r in rows if r["name"] == "vLLM SD")
    for r in rows:
        if "error" in r:
            continue
        r["peak_vs_sd"] = r["peak_running"] / base["peak_running"]
        r["mean_vs_sd"] = r["mean_running"] / base["mean_running"]
        r.pop("outputs")
    columns = [("name", "engine"), ("peak_running", "peak running"),
               ("peak_vs_sd", "peak / vLLM SD"), ("mean_running", "mean running"),
               ("mean_vs_sd", "mean / vLLM SD"),
               ("preemptions", "preemptions"), ("lookahead_slots", "lookahead slots (all layers)"),
               ("pool_blocks", "pool blocks"), ("draft_scratch_bytes", "draft-only bytes"),
               ("beam_rows", "rows with beam room"),
               ("narrowed_share", "drafted rows with one beam"),
               ("acceptance_length", "acceptance length"),
               ("steps", "engine steps"), ("seconds", "seconds")]
    table = markdown_table(rows, columns)
    for r in rows:
        if "error" in r:
            table += f"\n\n{r['name']} did not start: {r['error']}"
    workload_desc = {"requests": args.requests, "prompt_tokens": args.prompt_tokens,
                     "new_tokens": args.new_tokens, "kv_cache_bytes": kv_bytes,
                     "max_num_seqs": args.max_num_seqs, "block_size": args.block_size,
                     "max_model_len": args.max_model_len,
                     "gamma": GAMMA, "tau": TAU, "dtype": "float32", "temperature": 0.0,
                     "beam_kv_fractions": fractions}
    out = write_outputs("kv_cost", {"environment": environment(), "workload": workload_desc,
                                    "rows": rows}, table, args.out)
    plot(rows, out / "kv_cost.png")
    print(table)
    for r in rows:
        if "error" in r:
            print(f"{r['name']}: {r['error']}")
    print(f"written to {out}")


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "error" not in r]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = range(len(ok))
    ax.bar([i - 0.2 for i in x], [r["peak_running"] for r in ok], 0.4, label="peak running")
    ax.bar([i + 0.2 for i in x], [r["mean_running"] for r in ok], 0.4, label="mean running")
    ax.set_xticks(list(x), [r["name"] for r in ok], rotation=20)
    ax.set_ylabel("requests running at once")
    ax.set_title("Same KV budget, same workload")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
