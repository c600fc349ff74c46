"""A tiny patch helper: keeps originals, refuses double patching, logs, and can undo (tests).

Originals are kept here, not hung on vLLM's objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from vllm_mtad.log import get_logger

logger = get_logger(__name__)


@dataclass
class _Patch:
    owner: Any
    attr: str
    original: Any
    source: str  # the patch file that made it


# Module-level state: the patches applied in this process, as the patched attributes are
# (process-wide); this registry is what refuses double patching and what undo restores.
_PATCHES: dict[tuple[int, str], _Patch] = {}
_MISSING = object()


def is_patched(owner: Any, attr: str) -> bool:
    return (id(owner), attr) in _PATCHES


def original(owner: Any, attr: str) -> Any:
    """The attribute as it was before it was patched."""
    return _PATCHES[(id(owner), attr)].original


def patch(owner: Any, attr: str, make: Callable[[Any], Any], source: str) -> None:
    """Replace ``owner.attr`` with ``make(original)``; refuses an attribute already patched.

    ``original`` is read from the class ``__dict__`` when ``owner`` is a class, so properties
    and functions come back unbound.
    """
    key = (id(owner), attr)
    if key in _PATCHES:
        raise RuntimeError(f"{_name(owner)}.{attr} is already patched by {_PATCHES[key].source}; "
                           f"refusing to patch it again from {source}")
    orig = owner.__dict__.get(attr, _MISSING) if isinstance(owner, type) else getattr(owner, attr, _MISSING)
    if orig is _MISSING:
        raise AttributeError(f"{source}: {_name(owner)} has no attribute {attr!r}; the vLLM "
                             "internals this patch targets have changed")
    setattr(owner, attr, make(orig))
    _PATCHES[key] = _Patch(owner, attr, orig, source)
    logger.debug("vllm-mtad: %s patched %s.%s", source, _name(owner), attr)


def undo(owner: Any, attr: str) -> None:
    """Restore one patched attribute (for tests)."""
    p = _PATCHES.pop((id(owner), attr))
    setattr(p.owner, p.attr, p.original)


def _name(owner: Any) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
