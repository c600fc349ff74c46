"""Pins of the vLLM internals the glue relies on, per checked vLLM version: a vLLM upgrade that
changes one fails here, naming the internal and the file to re-check, instead of failing in a
server. The pins themselves are data in devtools/vllm_pins.py (shared with devtools.pin_check).

Each pin is the internal's signature and, where the glue copies upstream code or depends on its
exact lines, a hash of (or lines in) the upstream source. Signatures are in one canonical form,
the one ``python -m devtools.pin_check`` computes for a wheel that is not installed: parameters
and annotations *as written in the source* (``ast.unparse``), laid out as ``inspect.Signature``
lays them out (devtools/pin_check.py says why). Hashes are sha256[:16] of
``inspect.getsource``, which the offline check reproduces (checked below for every pin).

The installed vLLM is checked against the pins of its version (a patch release of a pinned
series without pins of its own: against its series' newest pins).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from devtools import pin_check
from devtools.vllm_pins import PIN_KEYS, PINS, SOURCE_LINES
from vllm_mtad.version import CHECKED_VLLM_VERSIONS

pytestmark = pytest.mark.unit


def _resolve(module: str, qualname: str):
    """The upstream object, also when one of our patches has replaced or wrapped it."""
    from vllm_mtad import patching

    obj = owner = importlib.import_module(module)
    for part in qualname.split("."):
        owner, obj = obj, getattr(obj, part)
    if patching.is_patched(owner, part):
        obj = patching.original(owner, part)
    return inspect.unwrap(obj)


def _definition(func) -> pin_check.Found:
    """The installed function's definition in its parsed file (found by the imported object's
    file and first line, not by the offline lookup)."""
    _, start = inspect.getsourcelines(func)
    path = Path(inspect.getsourcefile(func))
    tree, lines = pin_check.parse_file(path)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found = pin_check.Found(path, node, lines)
            if found.first_line == start:
                return found
    raise LookupError(f"no definition of {func} at {path}:{start}")


def _installed_pins() -> tuple[str, dict]:
    """(version whose pins apply, its pins) for the installed vLLM: pin_check.pins_for, the
    rule the offline check uses too."""
    import vllm

    applies = pin_check.pins_for(vllm.__version__)
    if applies is None:
        pytest.fail(f"no pins recorded for vLLM {vllm.__version__}'s series; record them "
                    f"(python -m devtools.pin_check {vllm.__version__} prints them) after "
                    "re-checking the glue")
    return applies


def check_pin(module, qualname, glue, want, pinned):
    """The installed internal against the pin ``want`` = (signature, source hash or None)
    recorded for ``pinned``, by the imported object (its definition's signature as written,
    the hash of inspect.getsource), compared as devtools.pin_check compares a wheel's."""
    func = _resolve(module, qualname)
    text = inspect.getsource(func)
    got = pin_check.Computed(pin_check.render_signature(_definition(func).node),
                             pin_check.source_hash(text), text)
    problems = pin_check.pin_problems(f"vLLM internal {module}.{qualname}", glue, got, want,
                                      pinned)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module,qualname,glue", PIN_KEYS, ids=[p[1] for p in PIN_KEYS])
def test_vllm_internal_is_as_the_glue_expects(module, qualname, glue):
    pinned, pins = _installed_pins()
    check_pin(module, qualname, glue, pins[(module, qualname, glue)], pinned)


@pytest.mark.parametrize("module,qualname,lines,ordered,glue", SOURCE_LINES,
                         ids=[p[1] for p in SOURCE_LINES])
def test_source_lines_the_glue_relies_on(module, qualname, lines, ordered, glue):
    why = pin_check.missing_lines(inspect.getsource(_resolve(module, qualname)), lines, ordered)
    assert why is None, f"vLLM's {qualname} {why}; re-check {glue}"


def test_workers_build_through_worker_base():
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.v1.worker.worker_base import WorkerBase

    for cls in (CPUWorker, Worker):
        assert issubclass(cls, WorkerBase), f"{cls} no longer builds through WorkerBase.__init__"
    assert "__init__" in WorkerBase.__dict__


def test_every_checked_version_is_pinned_alike():
    assert set(PINS) == set(CHECKED_VLLM_VERSIONS)
    for version, pins in PINS.items():
        assert set(pins) == set(PIN_KEYS), version


_OFFLINE = sorted({(m, q) for m, q, _ in PIN_KEYS} | {(m, q) for m, q, *_ in SOURCE_LINES})


@pytest.mark.parametrize("module,qualname", _OFFLINE, ids=[q for _, q in _OFFLINE])
def test_the_offline_check_reads_what_the_import_reads(module, qualname):
    """devtools.pin_check finds each function by parsing (no import) and hashes the text
    inspect.getsource gives: on the installed vLLM both ways meet, for every pin."""
    func = _resolve(module, qualname)
    found = pin_check.find_function(pin_check.installed_root(), module, qualname)
    _, start = inspect.getsourcelines(func)
    assert (found.file.resolve(), found.first_line) == (
        Path(inspect.getsourcefile(func)).resolve(), start)
    assert pin_check.source_segment(found) == inspect.getsource(func)


def test_every_vllm_import_of_the_glue_resolves_in_the_installed_vllm():
    """The one part of devtools.pin_check's run not checked above on the installed vLLM: the
    glue's vLLM imports (also those inside functions, which importing the glue does not run)."""
    repo = Path(__file__).resolve().parent.parent
    assert pin_check.unresolved_imports(pin_check.installed_root(), repo) == []


def test_a_patch_release_is_checked_against_its_series_pins():
    """pins_for: a version's own pins, else the newest recorded in its series, else None."""
    assert pin_check.pins_for("0.32.0") == ("0.32.0", PINS["0.32.0"])
    assert pin_check.pins_for("0.32.1") == ("0.32.0", PINS["0.32.0"])
    assert pin_check.pins_for("0.32.2+cpu") == ("0.32.0", PINS["0.32.0"])
    assert pin_check.pins_for("0.33.4") == ("0.33.0", PINS["0.33.0"])
    assert pin_check.pins_for("0.34.0") is None
    assert pin_check.pins_for("0.31.9") is None
    assert pin_check.pins_for("dev") is None
    # The moves are counted from the series before the pins that apply.
    assert pin_check.default_against("0.33.4") == "0.32.0"
    assert pin_check.default_against("0.33.0") == "0.32.0"
    assert pin_check.default_against("0.32.1") is None


_TRICKY = """
import functools


def plain(a, b=1, *args, c, d=None, **kw):
    return a


@functools.lru_cache(maxsize=None)
def decorated(x: int, /, y: "str" = "s") -> list[int]:
    # a comment in the body
    return [x]
    # a trailing comment at body depth (inspect keeps it)
# a comment at the left margin (inspect drops it)


class Base:
    def inherited(self, *, flag: bool = False) -> None:
        return None


class Holder(Base):
    @staticmethod
    def method(z: dict[str, int] | None = None, *, w: bool = False) -> None:
        \"\"\"Doc.\"\"\"
        pass

            # deeper, after a blank line: kept

    def later(self):
        return 1
"""


@pytest.mark.parametrize("qualname", ["plain", "decorated", "Holder.method", "Holder.later",
                                      "Holder.inherited"])
def test_the_offline_forms_match_inspect_on_tricky_definitions(tmp_path, qualname):
    """Decorators, trailing comments, positional-only and keyword-only parameters, a static
    method, an inherited method: the AST path gives inspect's text and signature layout (the
    annotations here read the same either way)."""
    import importlib.util
    import sys

    (tmp_path / "tricky_pins_mod.py").write_text(_TRICKY)
    spec = importlib.util.spec_from_file_location("tricky_pins_mod",
                                                  tmp_path / "tricky_pins_mod.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tricky_pins_mod"] = mod
    try:
        spec.loader.exec_module(mod)
        obj = mod
        for part in qualname.split("."):
            obj = getattr(obj, part)
        obj = inspect.unwrap(obj)
        found = pin_check.find_function(tmp_path, "tricky_pins_mod", qualname)
        assert pin_check.source_segment(found) == inspect.getsource(obj)
        assert pin_check.render_signature(found.node) == str(inspect.signature(obj))
    finally:
        del sys.modules["tricky_pins_mod"]


def test_an_import_the_glue_makes_that_vllm_lacks_is_reported(tmp_path):
    (tmp_path / "vllm_mtad").mkdir()
    (tmp_path / "vllm_mtad" / "x.py").write_text(
        "from vllm.config import VllmConfig, NoSuchConfig\nimport vllm.no_such_module\n")
    bad = pin_check.unresolved_imports(pin_check.installed_root(), tmp_path)
    assert len(bad) == 2 and "NoSuchConfig" in bad[0] and "no_such_module" in bad[1], bad


_SYNTHETIC_VLLM = {
    "vllm/__init__.py": "",
    "vllm/b.py": "class Real:\n    pass\n",
    "vllm/c.py": "",
    "vllm/pkg/__init__.py": "",
    "vllm/pkg/sub.py": "",
    "vllm/a.py": """
from typing import Any
from vllm.b import Real
from vllm.b import Missing  # b binds no Missing
from vllm.nosuch import Ghost  # no module vllm.nosuch
import vllm.c as c_mod
import vllm.nosuchmod as gone
from vllm.pkg import sub
Annotated: int  # binds nothing at run time
__all__ = ["Real", "lazy", "listed", "Pretend"]  # strings, not bindings
TABLE = {"listed": "vllm.b:Real"}


def __getattr__(name):
    if name == "lazy":
        return 1
    if name in TABLE:
        return 2
    if name in globals():
        return globals()[name]
    raise AttributeError(name)
""",
}


def test_an_import_chain_to_a_missing_name_is_reported_unresolved(tmp_path):
    """A re-export of a name or module that does not exist, an annotation without a value,
    a name that only occurs as a string beside a catch-all ``__getattr__``: unresolved, not
    taken as bound (a synthetic vllm tree, no import)."""
    root = tmp_path / "site"
    for name, text in _SYNTHETIC_VLLM.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    repo = tmp_path / "repo"
    (repo / "vllm_mtad").mkdir(parents=True)
    resolved = ["Any", "Real", "c_mod", "sub", "lazy", "listed"]
    unresolved = ["Missing", "Ghost", "gone", "Annotated", "Pretend"]
    (repo / "vllm_mtad" / "x.py").write_text(
        "".join(f"from vllm.a import {name}\n" for name in resolved + unresolved)
        + "from vllm.pkg import sub\nimport vllm.pkg.sub\nimport vllm.pkg.gone\n")
    bad = pin_check.unresolved_imports(root, repo)
    reported = [line.split(": ")[1] for line in bad]
    assert reported == [f"vllm.a {name}" for name in unresolved] + ["vllm.pkg.gone"], bad
    assert "vllm.nosuch" in bad[1] and "b.py" in bad[0], bad
    assert pin_check._bind(root, "vllm.a", "Any") == ("external", "typing.Any")


def test_a_changed_internal_fails_with_the_file_to_recheck():
    """The pin can fail: a signature or a source hash that differs is reported with the glue
    file."""
    with pytest.raises(AssertionError, match="signature .* pinned for a made-up version; "
                                             "re-check vllm_mtad/proposer.py"):
        check_pin("vllm.v1.spec_decode.draft_model", "DraftModelProposer.__init__",
                  "vllm_mtad/proposer.py", ("(self, vllm_config, device)", None),
                  "a made-up version")
    pinned, pins = _installed_pins()
    key = ("vllm.v1.sample.rejection_sampler", "RejectionSampler.forward", "vllm_mtad/sampler.py")
    with pytest.raises(AssertionError, match="source sha256 .* re-check vllm_mtad/sampler.py"):
        check_pin(*key, (pins[key][0], "0" * 16), pinned)
