"""The control for the cross-machine pairs: the target's greedy outputs generated on the Intel
Xeon (this folder's records.jsonl) against the AMD EPYC's (../records.jsonl), token for token.

    python benchmarks/reports/rules-quality-cpu/control-xeon/compare.py
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(path: Path, config: str = "target T0") -> dict:
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["config"] == config:
            out[(r["set"], r["prompt"])] = r
    return out


amd, xeon = load(HERE.parent / "records.jsonl"), load(HERE / "records.jsonl")
for name in ("humaneval", "chat"):
    keys = [k for k in xeon if k[0] == name and k in amd]
    same = sum(amd[k]["token_ids"] == xeon[k]["token_ids"] for k in keys)
    line = f"{name}: {same} of {len(keys)} outputs identical"
    if name == "humaneval":
        flips = sum(amd[k]["passed"] != xeon[k]["passed"] for k in keys)
        line += (f"; pass/fail differs on {flips}; passed: AMD EPYC "
                 f"{sum(amd[k]['passed'] for k in keys)}, Intel Xeon "
                 f"{sum(xeon[k]['passed'] for k in keys)}")
    print(line)
