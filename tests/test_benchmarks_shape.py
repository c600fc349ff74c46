"""The shape benchmarks/ keeps (issue 58), as tests/test_code_shape.py keeps the package's: one
program per question and at most 8 of them; programs that import, of this project, only
benchmarks.lib and the package (never each other, never devtools or tests: what they need of
devtools, benchmarks.lib names), at any depth, lazy imports included; programs and library that
set no environment when imported; output by default in benchmarks/results/ (ignored), never in
benchmarks/reports/; a reports folder of data and prose (no code, no file over 1 MB); a README
of at most 250 lines with one speed table, where speed ratios in prose count as tables (but in
the GPU projection's five lines, issue 60's). The last test feeds each counter synthetic input,
so that every check can fail."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from tests.test_docs import is_speed_table, tables

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
REPORTS = BENCHMARKS / "reports"

# At most this many programs.
MAX_PROGRAMS = 8
MAX_REPORT_BYTES = 1 << 20
MAX_README_LINES = 250
PROJECTION, PROJECTION_LINES = "- **On a GPU, a projection**", 5
RATIO = re.compile(r"\b\d+(?:\.\d+)?(?:[–-]\d+(?:\.\d+)?)?x\b")  # "1.3x", "1.07–1.94x"


def programs(folder: Path) -> list[Path]:
    """The benchmark programs: the .py files of ``folder`` itself (lib/ is their library)."""
    return sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")


def imported(source: str) -> set[str]:
    """Every module ``source`` imports, at any depth ("from benchmarks import x": benchmarks.x)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            if node.module == "benchmarks":
                out |= {f"benchmarks.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def program_imports(source: str) -> set[str]:
    """The benchmark programs (benchmarks.<name>, not benchmarks.lib) ``source`` imports."""
    return {m for m in imported(source)
            if m.startswith("benchmarks.") and m.split(".")[1] != "lib"}


def project_modules(root: Path) -> set[str]:
    """The top-level names this project's code is imported under: its packages (folders with
    an __init__.py) and its top-level modules."""
    return ({p.parent.name for p in root.glob("*/__init__.py")}
            | {p.stem for p in root.glob("*.py") if p.name != "__init__.py"})


def outside_imports(source: str, project: set[str]) -> set[str]:
    """The modules of this project (top-level names in ``project``) that ``source`` imports
    beyond benchmarks.lib and the package (vllm_mtad): devtools, tests, another program."""
    def allowed(module: str) -> bool:
        return (module.split(".")[0] == "vllm_mtad" or module in ("benchmarks", "benchmarks.lib")
                or module.startswith("benchmarks.lib."))

    return {m for m in imported(source) if m.split(".")[0] in project and not allowed(m)}


def environment_at_import(source: str) -> list[str]:
    """Statements at a module's top level (outside functions, classes and ``if __name__ ==
    "__main__"``) that set ``os.environ`` (an item assigned, setdefault, update): importing the
    module would change the importer's environment."""
    def sets(node) -> bool:
        for n in ast.walk(node):
            targets = n.targets if isinstance(n, ast.Assign) else (
                [n.target] if isinstance(n, ast.AugAssign) else [])
            if any(isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ"
                   for t in targets):
                return True
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and ast.unparse(n.func.value) == "os.environ"
                    and n.func.attr in ("setdefault", "update", "__setitem__")):
                return True
        return False

    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            continue
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and sets(node):
            found.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def output_defaults_in_reports(source: str) -> list[str]:
    """The ``add_argument("--out...", default=...)`` (and ``--log``) whose default names
    benchmarks/reports (what a run would then write into the committed reports)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith(("--out", "--log"))):
            continue
        for kw in node.keywords:
            if kw.arg == "default" and "reports" in ast.unparse(kw.value):
                found.append(f"{node.args[0].value}: {ast.unparse(kw.value)}")
    return found


def speed_tables(text: str) -> int:
    """Speed tables in a Markdown text (tests/test_docs.py's detection), plus every prose line
    (outside tables and code) with a speed ratio: a ratio in prose is a table cell without its
    table. Except the list item that opens with ``PROJECTION``: the GPU projection issue 60 asks
    the README to give in at most five lines, figures marked as projected, not measured
    (counted in lines, not exempt from them)."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    lines, projection = [], 0
    for line in prose.splitlines():
        if line.startswith("- ") or not line.strip():
            projection = PROJECTION_LINES if PROJECTION in line else 0
        if projection:
            projection -= 1
            continue
        if not line.lstrip().startswith("|") and RATIO.search(line):
            lines.append(line)
    return sum(is_speed_table(t) for t in tables(text)) + len(lines)


def committed(folder: Path) -> list[Path]:
    """The files git tracks under ``folder`` (every file there outside a git checkout)."""
    try:
        names = subprocess.run(["git", "ls-files", "-z", str(folder)], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")
        return [ROOT / n for n in names if n and (ROOT / n).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in folder.rglob("*") if p.is_file()]


def test_at_most_8_programs():
    assert len(programs(BENCHMARKS)) <= MAX_PROGRAMS, [p.name for p in programs(BENCHMARKS)]


def test_no_program_imports_another_and_the_library_imports_none():
    found = {p.name: program_imports(p.read_text())
             for p in programs(BENCHMARKS) + sorted((BENCHMARKS / "lib").glob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}


def test_programs_import_of_this_project_only_the_library_and_the_package():
    project = project_modules(ROOT)
    assert {"benchmarks", "devtools", "tests", "vllm_mtad"} <= project, project
    found = {p.name: outside_imports(p.read_text(), project) for p in programs(BENCHMARKS)}
    assert {k: v for k, v in found.items() if v} == {}


def test_no_environment_set_at_import():
    found = {p.name: environment_at_import(p.read_text())
             for p in programs(BENCHMARKS) + sorted((BENCHMARKS / "lib").glob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}


def test_no_default_output_in_the_reports():
    from benchmarks.lib.report import RESULTS

    assert RESULTS == BENCHMARKS / "results"
    found = {p.name: output_defaults_in_reports(p.read_text())
             for p in programs(BENCHMARKS) + sorted((BENCHMARKS / "lib").glob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_reports_hold_no_code_and_no_file_over_1_mb():
    files = committed(REPORTS)
    assert [str(p.relative_to(REPORTS)) for p in files if p.suffix == ".py"] == []
    assert {str(p.relative_to(REPORTS)): p.stat().st_size for p in files
            if p.stat().st_size > MAX_REPORT_BYTES} == {}


def test_the_readme_is_short_with_one_speed_table():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    assert speed_tables(text) == 1


def test_the_checks_can_fail(tmp_path):
    """Each counter above on synthetic input that breaks its rule."""
    for name in ("__init__.py", "a.py", "b.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "x.py").write_text("")
    assert [p.name for p in programs(tmp_path)] == ["a.py", "b.py"]
    (tmp_path / "devtools").mkdir()
    (tmp_path / "devtools" / "__init__.py").write_text("")
    assert project_modules(tmp_path) == {"a", "b", "devtools"}  # lib/: no __init__.py here
    project = {"benchmarks", "devtools", "tests", "vllm_mtad"}
    assert outside_imports("import os, torch\nimport vllm_mtad\n"
                           "from vllm_mtad.timing import PHASES\n"
                           "from benchmarks.lib.engines import close\nfrom benchmarks import lib\n"
                           "from devtools.engine import close\n"
                           "def f():\n    import devtools.models\n"
                           "    from tests.engine_utils import make_llm\n"
                           "    from benchmarks import speed\n", project) == {
        "devtools.engine", "devtools.models", "tests.engine_utils", "benchmarks.speed"}
    assert program_imports("from benchmarks.acceptance import run\nimport benchmarks.speed\n"
                           "from benchmarks import quality, lib\n"
                           "from benchmarks.lib.stats import summary\n"
                           "def f():\n    from benchmarks.soak import main\n") == {
        "benchmarks.acceptance", "benchmarks.speed", "benchmarks.quality", "benchmarks.soak"}
    assert environment_at_import('import os\nos.environ.setdefault("A", "1")\nX = os.environ.get("B")\n'
                                 'def main():\n    os.environ["C"] = "1"\n'
                                 'if __name__ == "__main__":\n    os.environ["D"] = "1"\n') == [
        'line 2: os.environ.setdefault(\'A\', \'1\')']
    assert output_defaults_in_reports(
        'ap.add_argument("--out", type=Path, default=Path("benchmarks/reports/x"))\n'
        'ap.add_argument("--log", default=RESULTS / "log")\n'
        'ap.add_argument("--acceptance", default="benchmarks/reports/a.json")\n') == [
        "--out: Path('benchmarks/reports/x')"]
    assert speed_tables("| a | tok/s |\n|---|---|\n| x | 1 |\n\n| γ | tokens / pass |\n"
                        "|---|---|\n| 4 | 4.2 |\n") == 1
    assert speed_tables("| a | tok/s |\n|---|---|\n\nMTAD runs 1.3x SD.\n") == 2
    assert speed_tables("at γ=8 FLy 1.30–1.50x, W=4 3 beams\n```\nspeed 2x\n```\n") == 1
    projected = f"{PROJECTION} (a report):\n  SD 1.1x, MTAD 1.3x\n  3.2x the target\n"
    assert speed_tables(projected) == 0
    assert speed_tables(projected + "- **Measured**: MTAD 1.2x SD\n") == 1
    assert speed_tables(projected.replace("a projection", "measured")) == 2
    assert speed_tables(projected + "".join(f"  line {i}: 1.{i}x\n" for i in range(4))) == 2
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * (MAX_REPORT_BYTES + 1))
    assert [p.name for p in committed(tmp_path) if p.stat().st_size > MAX_REPORT_BYTES] == [
        "big.jsonl"]
