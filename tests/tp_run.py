"""Run MTAD with tensor parallelism in a fresh process (used by tests/test_e2e_tp.py).

Usage: python -m tests.tp_run TARGET DRAFT TP [POLICY[,POLICY...]]  -> prints one line
"RESULT {json}" per policy, in order (one engine each, one after the other).
"""

from __future__ import annotations

import json
import os
import sys

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 50)), list(range(200, 262))]


def run(target, draft, tp, in_process=False, policy="fixed"):
    from vllm import SamplingParams

    from tests.engine_utils import close, generate_ids, make_llm, mtad_spec
    from vllm_mtad.worker_rpc import drafter_stats

    # collective_rpc(drafter_stats) sends a function to the mp executor's workers (a test).
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    kwargs = {} if in_process else {"distributed_executor_backend": "mp"}
    llm = make_llm(target, mtad_spec(draft, 4, 4, 0.5, speculation_policy=policy),
                   tensor_parallel_size=tp, **kwargs)
    greedy = generate_ids(llm, PROMPTS, SamplingParams(max_tokens=40, temperature=0.0,
                                                       ignore_eos=True))
    sampled = generate_ids(llm, PROMPTS, [SamplingParams(max_tokens=40, temperature=1.0,
                                                         top_k=10, seed=i, ignore_eos=True)
                                          for i in range(len(PROMPTS))])
    exact = generate_ids(llm, PROMPTS, SamplingParams(
        max_tokens=40, temperature=0.0, ignore_eos=True,
        extra_args={"greedy_acceptance": "exact"}))
    chosen = [s.get("policy_chosen") for s in llm.collective_rpc(drafter_stats)]
    close(llm)
    return {"greedy": greedy, "sampled": sampled, "exact": exact, "chosen": chosen}


def main():
    target, draft, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for policy in (sys.argv[4] if len(sys.argv) > 4 else "fixed").split(","):
        print("RESULT " + json.dumps(run(target, draft, tp, policy=policy)), flush=True)


if __name__ == "__main__":
    main()
