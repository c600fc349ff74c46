"""Records and tables: the machine and code a result came from (``environment``; the CPU's
model and flags alone: ``cpu_model_and_flags``, devtools.engine's), and the output files (JSON
for machines, Markdown for people, in benchmarks/results/ unless told otherwise)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path

from devtools.engine import cpu_model_and_flags

RESULTS = Path(__file__).resolve().parents[1] / "results"  # benchmarks/results/, ignored by git


def environment() -> dict:
    import torch
    import vllm

    import vllm_mtad

    cpu = cpu_model_and_flags()
    return {"vllm": vllm.__version__, "vllm_mtad": vllm_mtad.__version__,
            "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(),
            "processor": platform.processor() or cpu.get("cpu_model", "unknown"), **cpu,
            "cpus": os.cpu_count(), "gpu": torch.cuda.get_device_name(0)
            if torch.cuda.is_available() else None,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def records_environment(previous: Path, report_only: bool) -> dict:
    """The environment a report's records were made in: this machine's after a run; for
    ``--report-only``, the one the report being rewritten (``previous``, its JSON) recorded,
    with "reported_on", this machine's CPU (a report rewritten elsewhere must not claim the
    rewriting machine ran it). This machine's where there is no earlier report."""
    env = environment()
    if report_only and previous.exists():
        earlier = json.loads(previous.read_text()).get("environment")
        if earlier:
            return earlier | {"reported_on": env.get("cpu_model", env["processor"])}
    return env


def code_commit() -> str:
    """This checkout's commit ("unknown" outside a git checkout), for the record."""
    return _git("rev-parse", "HEAD").decode().strip() or "unknown"


def code_version(paths=("vllm_mtad", "patches", "devtools/engine.py", "devtools/models.py",
                        "setup.py", "benchmarks/lib/engines.py", "benchmarks/lib/runner.py",
                        "benchmarks/lib/report.py", "benchmarks/lib/prompts.py",
                        "benchmarks/lib/stats.py", "benchmarks/speed.py"),
                 extra: tuple[str, ...] = ()) -> str:
    """A hash of the code that makes a benchmark's numbers: ``paths`` and ``extra`` (folders
    and files of this checkout; ``extra`` for a program's own files beside the defaults) as
    committed, and any uncommitted change to them ("unknown" outside a git checkout). Unlike
    the commit it stays the same when only reports or documents are committed, so that a long
    run can be put together from parts measured by the same code."""
    paths = tuple(paths) + tuple(extra)
    trees = [_git("rev-parse", f"HEAD:{path}") for path in paths]
    if not all(trees):
        return "unknown"
    diff = _git("diff", "HEAD", "--", *paths)
    return hashlib.sha1(b"".join(trees) + diff).hexdigest()[:16]


def _git(*args) -> bytes:
    """git's output in this checkout; b"" where git fails."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return b""


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
