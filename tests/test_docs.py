"""The design lives in docs/: every reference to it (from code, tests, scripts, the README and
the docs themselves) names a file that exists and a heading that is there; every path the
README's Layout table names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parent.parent
SOURCES = [p for pattern in ("vllm_mtad/**/*.py", "patches/**/*.py", "devtools/*.py",
                             "benchmarks/*.py", "tests/*.py", "scripts/*.sh", "*.md", "docs/*.md")
           for p in ROOT.glob(pattern)]


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def references():
    """(file, referenced doc path, anchor or None) for docs/ paths and links between docs."""
    for src in SOURCES:
        text = src.read_text()
        for doc, anchor in re.findall(r"docs/([\w.-]+\.md)(?:#([\w-]+))?", text):
            yield src, ROOT / "docs" / doc, anchor or None
        if src.parent.name == "docs":
            for doc, anchor in re.findall(r"\]\(([\w.-]+\.md)?(?:#([\w-]+))?\)", text):
                if doc or anchor:
                    yield src, (src.parent / doc) if doc else src, anchor or None


def test_every_docs_reference_resolves():
    refs = list(references())
    assert len(refs) > 20  # the code does point into docs/
    bad = []
    for src, doc, anchor in refs:
        if not doc.exists():
            bad.append(f"{src.relative_to(ROOT)} -> {doc.relative_to(ROOT)} (no such file)")
        elif anchor and anchor not in anchors(doc):
            bad.append(f"{src.relative_to(ROOT)} -> {doc.relative_to(ROOT)}#{anchor} (no heading)")
    assert not bad, "\n".join(bad)


def test_no_reference_to_design_notes_outside_the_repository():
    stale = [str(p.relative_to(ROOT)) for p in SOURCES
             if p.name != "test_docs.py" and "DESIGN.md" in p.read_text()]
    assert not stale, stale


def test_readme_layout_paths_exist():
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    paths = re.findall(r"^\| `([^`]+)`", layout, flags=re.M)
    assert len(paths) > 5
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, missing


def test_slug_matches_github():
    assert slug("Expand-kernel stand-in (temperature > 0 on CPU)") == \
        "expand-kernel-stand-in-temperature--0-on-cpu"
    assert slug("Tensor parallel on CPU needs VLLM_CPU_OMP_THREADS_BIND") == \
        "tensor-parallel-on-cpu-needs-vllm_cpu_omp_threads_bind"
