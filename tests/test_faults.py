"""A wrong setup fails at startup with a message naming the setting and what to change (a dead
worker under the server: tests/test_serve.py, the last test there, on its server).

The startup faults stop LLM() before it builds an engine, so they are tested on its first step
(tests.engine_utils.engine_config, no model loaded); one in-process engine checks that a
fitting setup starts.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.engine_utils import close, engine_config, make_llm, mtad_spec


def _refused(target_dir, spec, **kwargs) -> str:
    """The error ``make_llm(target_dir, spec, **kwargs)`` stops with before any engine exists."""
    with pytest.raises(Exception) as err:
        engine_config(target_dir, spec, **kwargs)
    return str(err.value)


def _draft_copy(draft_dir, tmp_path, file: str, change) -> str:
    """A copy of the draft with ``change`` applied to one of its JSON files."""
    copy = tmp_path / "draft"
    shutil.copytree(draft_dir, copy)
    data = json.loads((copy / file).read_text())
    change(data)
    (copy / file).write_text(json.dumps(data))
    return copy


@pytest.mark.unit
def test_missing_draft_directory(tiny_pair_dirs, tmp_path):
    target_dir, _ = tiny_pair_dirs
    msg = _refused(target_dir, mtad_spec(tmp_path / "no-such-draft"))
    assert "MTAD setting 'model'" in msg and "does not exist" in msg, msg


@pytest.mark.unit
def test_unreadable_draft_config(tiny_pair_dirs, tmp_path):
    target_dir, draft_dir = tiny_pair_dirs
    broken = tmp_path / "draft"
    shutil.copytree(draft_dir, broken)
    (broken / "config.json").write_text("{not json")
    msg = _refused(target_dir, mtad_spec(broken))
    assert "MTAD setting 'model'" in msg and "config.json" in msg, msg


@pytest.mark.unit
def test_draft_with_another_tokenizer(tiny_pair_dirs, tmp_path):
    """Same vocabulary size, two tokens' ids swapped: vLLM would run it, MTAD refuses."""
    target_dir, draft_dir = tiny_pair_dirs

    def swap_two(tok):
        vocab = tok["model"]["vocab"]
        a, b = sorted(vocab, key=vocab.get)[100:102]
        vocab[a], vocab[b] = vocab[b], vocab[a]

    other = _draft_copy(draft_dir, tmp_path, "tokenizer.json", swap_two)
    msg = _refused(target_dir, mtad_spec(other))
    assert "MTAD setting 'model'" in msg and "tokenizer differs" in msg, msg


@pytest.mark.unit
def test_gamma_that_cannot_fit_max_model_len(tiny_pair_dirs):
    target_dir, draft_dir = tiny_pair_dirs
    msg = _refused(target_dir, mtad_spec(draft_dir, gamma=300), max_model_len=256)
    assert "num_speculative_tokens" in msg and "max_model_len" in msg, msg


@pytest.mark.engine
def test_draft_whose_context_is_shorter_than_max_model_len(tiny_pair_dirs, tmp_path):
    """vLLM would start and silently stop drafting past the draft's 256 positions."""
    target_dir, draft_dir = tiny_pair_dirs
    short = _draft_copy(draft_dir, tmp_path, "config.json",
                        lambda config: config.update(max_position_embeddings=256))
    msg = _refused(target_dir, mtad_spec(short), max_model_len=1024)
    assert "MTAD setting 'model'" in msg and "--max-model-len 256" in msg, msg
    # Accepted when the engine's context fits the draft's.
    llm = make_llm(target_dir, mtad_spec(short), max_model_len=256)
    close(llm)
