"""Shared bits of the benchmark programs: environment record, output files, tables."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def environment() -> dict:
    import torch
    import vllm

    import vllm_mtad

    return {"vllm": vllm.__version__, "vllm_mtad": vllm_mtad.__version__,
            "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "processor": platform.processor() or "unknown",
            "cpus": os.cpu_count(), "gpu": torch.cuda.get_device_name(0)
            if torch.cuda.is_available() else None,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """columns: (key, header); floats printed with 3 significant digits."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(h for _, h in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(k, "")) for k, _ in columns) + " |")
    return "\n".join(lines)


def write_outputs(name: str, payload: dict, table: str, out_dir: Path | None = None) -> Path:
    out_dir = Path(out_dir or RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=2))
    (out_dir / f"{name}.md").write_text(table + "\n")
    return out_dir
