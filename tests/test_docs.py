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
                             "benchmarks/*.py", "benchmarks/lib/*.py", "tests/*.py",
                             "scripts/*.sh", "*.md", "docs/*.md")
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


def tables(markdown: str) -> list[list[str]]:
    """The Markdown tables of a text outside code blocks, each as its lines."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    out, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            out.append(current)
            current = []
    return [t for t in out if len(t) > 1 and set(t[1].replace("|", "").strip()) <= set("-: ")]


def is_speed_table(table: list[str]) -> bool:
    """A table of speed: tokens/s or speed ratios in its header, or tok/s figures in its cells."""
    header = table[0].lower()
    return ("tok/s" in header or "/ sd" in header or "/ target" in header
            or any(re.search(r"\d x\b|\d\.\d+x\b", row) for row in table[2:]))


def test_readme_stays_short_with_one_speed_table():
    """The README is what a user reads in five minutes: at most 250 lines and one speed table
    (results go to benchmarks/reports/ and docs/, not back into the README)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, len(readme.splitlines())
    speed = [t[0] for t in tables(readme) if is_speed_table(t)]
    assert len(speed) <= 1, speed


def test_speed_table_detection():
    two = "| a | tok/s |\n|---|---|\n| x | 1 |\n\ntext\n\n| c | d |\n|---|---|\n| y | 1.31x |\n"
    assert [is_speed_table(t) for t in tables(two)] == [True, True]
    assert not any(is_speed_table(t) for t in tables("| key | default |\n|---|---|\n| W | 4 |\n"))
    assert tables("```\n| a |\n|---|\n```\n") == []


def test_every_relative_link_resolves():
    """Links in the README, docs/ and the reports' pages to files of this repository (relative,
    with or without a folder) name files that exist: a report moved or removed cannot leave a
    dangling link behind."""
    pages = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/reports/**/*.md")]
    bad = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            if not (page.parent / target).exists():
                bad.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not bad, "\n".join(bad)
