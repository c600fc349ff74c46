"""The request state the drafter and the sampler share: drafts kept for the step vLLM's
``draft_probs`` channel misses, and the requests' noise seeds."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.unit


def test_draft_store_matches_scheduled_drafts_and_prunes():
    from vllm_mtad.request_state import DraftStore

    store = DraftStore()
    store.put(["a", "b"], torch.tensor([[1, 2, 3], [4, 5, 6]]),
              torch.tensor([[-0.1, -0.2, -0.3], [-1.0, -2.0, -3.0]]))

    def lookup(req_id, scheduled):
        lps, ok = store.lookup([req_id], torch.tensor([scheduled]))
        return lps[0].tolist() if bool(ok[0]) else "mismatch"

    assert lookup("a", [1, 2, 3]) == pytest.approx([-0.1, -0.2, -0.3])
    assert lookup("a", [1, 2, -1]) == pytest.approx([-0.1, -0.2, 0.0])  # fewer scheduled
    assert lookup("b", [4, -1, 6]) == pytest.approx([-1.0, 0.0, -3.0])  # an invalid position
    assert lookup("a", [1, 9, 3]) == "mismatch"  # not this drafter's tokens
    assert lookup("c", [1, -1, -1]) == "mismatch"  # no entry
    # A request without an entry (a new one) does not cost the others their log-probs.
    lps, ok = store.lookup(["a", "c"], torch.tensor([[1, 2, 3], [-1, -1, -1]]))
    assert ok.tolist() == [True, True] and lps[0].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert store.lookup(["c"], torch.tensor([[5, -1, -1]]))[1].tolist() == [False]
    # A later round without "a" (skipped this step) keeps "a"; a finished request is dropped.
    store.put(["b"], torch.tensor([[7, 8, 9]]), torch.zeros(1, 3))
    assert lookup("a", [1, 2, 3]) == pytest.approx([-0.1, -0.2, -0.3])
    assert lookup("b", [7, 8, 9]) == [0.0, 0.0, 0.0]
    store.put(["b"], torch.tensor([[7, 8, 9]]), torch.zeros(1, 3))
    store.forget(["a"])  # the request state's rule: a finished request is forgotten
    assert lookup("a", [1, 2, 3]) == "mismatch"
    # Longer drafts than the store's (γ grew): the missing positions never match.
    assert lookup("b", [7, 8, 9, 5]) == "mismatch"


def test_request_seed_is_stable_and_uses_the_seed():
    from types import SimpleNamespace

    from vllm_mtad.request_state import request_seed

    assert request_seed(SimpleNamespace(seed=42), "x") == 42
    a = request_seed(SimpleNamespace(seed=None), "req-1")
    assert a == request_seed(SimpleNamespace(seed=None), "req-1") >= 0
    assert a != request_seed(SimpleNamespace(seed=None), "req-2")
