"""Diagnostic probe (not a benchmark; kept with its outputs): in the grid's own setting (a
process per repeat, the three engines built afresh in it in the grid's order, huge pages for
PyTorch's large allocations), is MTAD's engine slower than the target alone when it does not
draft at all?

    python benchmarks/reports/policy-probe-cpu/probe7_g0.py OUT.json [--cell "T=0 exact"]
        [--batch 4] [--repeats 4] [--configs target,mtad_g0,vllm_sd,mtad_adaptive] [--trace]

"mtad_g0" is the MTAD engine with its policy bounded to γ ≤ 0 (vllm_mtad.speculation.
limit_plans(0)): every step drafts nothing. Everything else is benchmarks.policy_grid's
(Grid.repeat: warm-up on other prompts, then the configurations timed in run_order), with
--repeats processes instead of the grid's two. Each run also records the wall time of every
engine step (EngineCore.step), so that the decode steps can be told from the prompts' steps,
and with --trace the policy's every decision (the batch, every arm's expected tokens and
seconds, the choice: vllm_mtad.core.policy.choose) and every cost sample (LinearCost.add, by
cost line), in the order they happened, interleaved with the steps.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "..")))

from benchmarks import policy_grid as G  # noqa: E402

sys.path.insert(0, HERE)
from probe_hooks import plan_record  # noqa: E402

STEPS = []
LOG = []  # --trace: ("step", s) / ("plan", ...) / ("sample", ...) in the order they happened
TRACE = os.environ.get("PROBE7_TRACE") == "1"
NAMES = {}


def _wrap_policy():
    from vllm_mtad.core import policy as P

    if getattr(P.choose, "_probe7", False):
        return
    orig_choose, orig_add = P.choose, P.LinearCost.add

    def choose(batch, costs, stats, bounds, step, **kw):
        plan = orig_choose(batch, costs, stats, bounds, step, **kw)
        LOG.append(plan_record(P, batch, costs, stats, bounds, plan, 3, 5)
                   | {"no_draft_ratio": round(costs.no_draft_ratio(batch.size).value, 4)})
        return plan

    def add(self, size, seconds):
        LOG.append({"kind": "sample", "model": NAMES.get(id(self), "?"),
                    "size": list(size) if isinstance(size, (tuple, list)) else size,
                    "s": round(seconds, 5)})
        return orig_add(self, size, seconds)

    choose._probe7 = True
    P.choose, P.LinearCost.add = choose, add


def _name_models(worker):
    c = worker.model_runner.drafter.speculation.costs
    return {id(c.verify): "verify", id(c.first_pass): "first_pass",
            id(c.beam_step): "beam_step", id(c.rest): "rest"}


def _wrap_steps():
    from vllm.v1.engine import core as core_mod

    if getattr(core_mod.EngineCore.step, "_probe7", False):
        return
    orig = core_mod.EngineCore.step

    def step(self):
        t0 = time.perf_counter()
        out = orig(self)
        STEPS.append(time.perf_counter() - t0)
        if TRACE:
            LOG.append({"kind": "step", "s": round(STEPS[-1], 5)})
        return out

    step._probe7 = True
    core_mod.EngineCore.step = step


class ProbeGrid(G.Grid):
    def __init__(self, args, target, draft, tiny, configs):
        super().__init__(args, target, draft, tiny)
        self.mtad_limits["mtad_g0"] = 0
        self._configs = configs

    def configs(self, cell_name):
        return list(self._configs)

    def build(self, name, cell_name):
        _wrap_steps()
        if TRACE:
            _wrap_policy()
        llm = super().build(name, cell_name)
        if TRACE and name == "mtad":
            NAMES.update(llm.collective_rpc(_name_models)[0])
        return llm

    def run(self, engines, config, cell_name, batch, chunk, seed):
        STEPS.clear()
        LOG.clear()
        res = super().run(engines, config, cell_name, batch, chunk, seed)
        if TRACE:
            res["log"] = list(LOG)
        steps = list(STEPS)
        res["steps"] = len(steps)
        res["step_median_ms"] = 1000 * statistics.median(steps) if steps else None
        res["step_seconds"] = [round(s, 5) for s in steps]
        return res


def main():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--cell", default="T=0 exact")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--configs", default="target,mtad_g0,vllm_sd,mtad_adaptive")
    ap.add_argument("--trace", action="store_true", help="log the policy's decisions (docstring)")
    a = ap.parse_args()
    if a.trace:  # read by the repeats' processes
        os.environ["PROBE7_TRACE"] = "1"
    from devtools.models import resolve_pair

    # The grid's own settings (policy_grid's defaults, and the command of grid-eceb5f1).
    args = argparse.Namespace(tiny=False, batches=[1, 4, 16, 48], tokens=48, gamma=4,
                              long_gamma=8, repeats=a.repeats, min_prompts=4,
                              arrivals="queued", queue_depth=3, instances="repeat")
    target, draft, _ = resolve_pair(argparse.Namespace(tiny=False, target=None, draft=None))
    grid = ProbeGrid(args, target, draft, False, a.configs.split(","))
    prompts = G.humaneval_prompts(2 * G.HALF)
    n = G.prompts_per_run(a.batch, args.queue_depth, args.min_prompts)
    warm, timed = prompts[G.HALF: G.HALF + n], prompts[:n]
    env = G.environment() | {"commit": G.code_commit(), "code_version": G.code_version()}
    runs = []
    for r in range(a.repeats):
        measured, _ = G.in_own_process(grid, a.cell, a.batch, r, grid.configs(a.cell), warm,
                                       timed, lambda k: None)
        for config, res in measured:
            runs.append({"repeat": r, "config": config} | res)
            print(f"repeat {r} {config:14s} {res['tok_s']:6.2f} tok/s, steps {res['steps']}, "
                  f"median step {res['step_median_ms']:.1f} ms, chosen {res['chosen']}",
                  flush=True)
        with open(a.out, "w") as f:
            json.dump({"cell": a.cell, "batch": a.batch, "configs": grid.configs(a.cell),
                       "environment": env,
                       "runs": runs}, f)
    for config in grid.configs(a.cell):
        tps = [x["tok_s"] for x in runs if x["config"] == config]
        meds = [x["step_median_ms"] for x in runs if x["config"] == config]
        print(f"{config:14s} tok/s median {statistics.median(tps):6.2f} "
              f"[{min(tps):.2f}, {max(tps):.2f}]  median step {statistics.median(meds):.1f} ms")


if __name__ == "__main__":
    main()
