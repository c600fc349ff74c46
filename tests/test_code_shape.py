"""The shape the house keeps (issue 45): small policy files, short functions, short signatures,
and arrows that point down (the memory planner does not import the drafter)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vllm_mtad"


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(ROOT), node


def _parameters(node) -> int:
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs
             if x.arg not in ("self", "cls")]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def test_policy_files_are_at_most_300_lines():
    long = {p.name: n for p in (PACKAGE / "policy").glob("*.py")
            if (n := len(p.read_text().splitlines())) > 300}
    assert long == {}


def test_no_function_is_over_60_lines_or_7_parameters():
    long = [f"{p}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for p, f in _functions() if f.end_lineno - f.lineno + 1 > 60]
    wide = [f"{p}:{f.lineno} {f.name} ({_parameters(f)} parameters)"
            for p, f in _functions() if _parameters(f) > 7]
    assert long == [] and wide == []


def test_the_drafters_propose_reads_in_at_most_40_lines():
    from vllm_mtad.proposer import MTADProposer  # noqa: F401  (it imports)

    tree = ast.parse((PACKAGE / "proposer.py").read_text())
    propose = next(n for n in ast.walk(tree)
                   if isinstance(n, ast.FunctionDef) and n.name == "propose")
    assert propose.end_lineno - propose.lineno + 1 <= 40


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_arrows_point_down():
    """The memory planner and the request state know nothing of the drafter or the sampler;
    the policy's pricing modules import neither vLLM nor torch."""
    for low in ("draft_scratch.py", "request_state.py", "beam_kv.py", "draft_kv.py"):
        assert not {"vllm_mtad.proposer", "vllm_mtad.sampler"} & _imports(PACKAGE / low), low
    for pure in ("cost.py", "stats.py", "batch.py", "choice.py"):
        found = _imports(PACKAGE / "policy" / pure)
        assert not {m for m in found if m.split(".")[0] in ("vllm", "torch")}, pure


def test_the_checks_can_fail(tmp_path):
    """The counters above measure what they claim: a function of 61 lines and one of 8
    parameters are caught."""
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    tree = ast.parse(f"def f(a, b, c, d, e, f, g, h):\n{body}\n")
    f = tree.body[0]
    assert f.end_lineno - f.lineno + 1 == 61 and _parameters(f) == 8


def test_setup_installs_every_package():
    """A non-editable install ships only the packages setup.py names: every folder of the
    package with an __init__.py is one of them."""
    import re

    names = set(re.findall(r'"(vllm_mtad[\w.]*)"', (ROOT / "setup.py").read_text()))
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    found |= {"vllm_mtad.patches." + p.parent.name for p in (ROOT / "patches").glob("*/__init__.py")}
    assert found - {"vllm_mtad.patches"} <= names
