"""Run MTAD with tensor parallelism in a fresh process (used by tests/test_e2e_tp.py).

Usage: python -m tests.tp_run TARGET DRAFT TP  -> prints one line "RESULT {json}".
"""

from __future__ import annotations

import json
import sys

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 50)), list(range(200, 262))]


def run(target, draft, tp, in_process=False):
    from vllm import SamplingParams

    from tests.engine_utils import close, generate_ids, make_llm, mtad_spec

    kwargs = {} if in_process else {"distributed_executor_backend": "mp"}
    llm = make_llm(target, mtad_spec(draft, 4, 4, 0.5), tensor_parallel_size=tp, **kwargs)
    greedy = generate_ids(llm, PROMPTS, SamplingParams(max_tokens=40, temperature=0.0,
                                                       ignore_eos=True))
    sampled = generate_ids(llm, PROMPTS, [SamplingParams(max_tokens=40, temperature=1.0,
                                                         top_k=10, seed=i, ignore_eos=True)
                                          for i in range(len(PROMPTS))])
    close(llm)
    return {"greedy": greedy, "sampled": sampled}


def main():
    target, draft, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print("RESULT " + json.dumps(run(target, draft, tp)))


if __name__ == "__main__":
    main()
