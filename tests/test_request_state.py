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


def test_draft_distributions_keep_each_requests_latest_round():
    """The draft's q̃ per position, kept per request for a baseline rule: read at any
    position (past the draft: its last), sparse rounds of different K padded with probability
    0, a dense round making every row dense, and a clear error for a request never kept."""
    import pytest
    import torch

    from vllm_mtad.core.processing import Candidates
    from vllm_mtad.request_state import DraftDistributions

    none = torch.zeros(2, dtype=torch.bool)
    d = DraftDistributions()
    lp = torch.log(torch.tensor([[[0.7, 0.3], [0.6, 0.4]], [[0.5, 0.5], [0.9, 0.1]]]))
    ids = torch.tensor([[[3, 1], [2, 4]], [[0, 5], [1, 2]]])
    d.put(["a", "b"], [Candidates(lp[:, j], ids[:, j], none) for j in range(2)])
    got = d.at(["b", "a"], torch.tensor([1, 5]))
    assert got.token_ids.tolist() == [[1, 2], [2, 4]]
    assert torch.allclose(got.logprobs.exp(), torch.tensor([[0.9, 0.1], [0.6, 0.4]]))
    d.put(["c"], [Candidates(torch.log(torch.tensor([[0.2, 0.3, 0.5]])),
                             torch.tensor([[1, 2, 3]]), none[:1])])
    wide = d.at(["a", "c"], torch.tensor([0, 0]))
    assert wide.token_ids.shape == (2, 3) and wide.logprobs[0, 2].item() == float("-inf")
    d.put(["e"], [Candidates(torch.log(torch.full((1, 6), 1 / 6)), None, none[:1])])
    dense = d.at(["a", "e"], torch.tensor([0, 0]))
    assert dense.token_ids is None and dense.logprobs.shape == (2, 6)
    assert torch.allclose(dense.logprobs[0].exp(), torch.tensor([0, 0.3, 0, 0.7, 0, 0]))
    d.forget(["a"])
    with pytest.raises(RuntimeError, match="no draft distribution kept"):
        d.at(["a"], torch.tensor([0]))
    # a row the rule will not read (a request in its prefill step) needs none: a placeholder
    got = d.at(["new", "b"], torch.tensor([0, 1]), needed=torch.tensor([False, True]))
    assert got.token_ids.tolist() == [[0, 0], [1, 2]]
    assert got.logprobs[0].tolist() == [0.0, float("-inf")]
    assert torch.allclose(got.logprobs[1].exp(), torch.tensor([0.9, 0.1]))
    dense = d.at(["new", "e"], torch.tensor([0, 0]), needed=torch.tensor([False, True]))
    assert dense.token_ids is None and dense.logprobs[0].exp().tolist() == [1, 0, 0, 0, 0, 0]
    # vLLM's dummy rows past the requests (its warm-up): placeholders too
    assert d.at(["b"], torch.tensor([1, 0, 0]),
                needed=torch.tensor([True, True, False])).token_ids.shape == (3, 2)
    with pytest.raises(RuntimeError, match=r"requests \['new'\]"):
        d.at(["new", "b"], torch.tensor([0, 1]), needed=torch.tensor([True, True]))
