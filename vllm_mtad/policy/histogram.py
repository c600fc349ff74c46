"""The accepted lengths of verified drafts, counted on the device by the rejection sampler and
read on the host every few steps into :class:`vllm_mtad.policy.stats.AcceptanceStats`."""

from __future__ import annotations

import torch

from vllm_mtad.policy.stats import CLASSES

CLASS_INDEX = {c: i for i, c in enumerate(CLASSES)}


class AcceptanceHistogram:
    """[classes, W, γ+1 length, γ+1 accepted, 2] counts on the device: every verified draft
    (last index 1) and each of its shorter prefixes (0), with what the rule accepted of those
    tokens alone (#acceptance-per-length)."""

    def __init__(self, beam_width: int, max_tokens: int, device: torch.device):
        self.W, self.G, self.device = beam_width, max_tokens, device
        G, W = max_tokens, beam_width
        self._counts = torch.zeros(len(CLASSES) * W * (G + 1) * (G + 1) * 2, dtype=torch.int64,
                                   device=device)
        self.read = [0] * self._counts.numel()  # the counts at the last read_into()

    def record(self, classes: list[str], widths: list[int], drafted: torch.Tensor,
               prefix_accepted: torch.Tensor) -> None:
        """Count each row's verified draft. Device tensors: ``drafted`` [B], each row's draft
        length; ``prefix_accepted`` [B, γ], column g-1 the tokens accepted of the draft's first
        g tokens alone (AcceptanceResult.prefix_accepted; the last column is the row's k*)."""
        G, W = self.G, self.W
        B, gamma = prefix_accepted.shape
        if B == 0 or gamma == 0:
            return
        base = torch.tensor([(CLASS_INDEX[c] * W + min(w, W) - 1) * (G + 1) * (G + 1) * 2
                             for c, w in zip(classes, widths)], dtype=torch.int64)
        base = base.to(self.device, non_blocking=True)
        lengths = torch.arange(1, gamma + 1, device=self.device)
        drafted = drafted.to(torch.int64).clamp(0, G)[:, None]
        idx = (base[:, None] + lengths * (G + 1) * 2 + prefix_accepted.clamp(0, G) * 2
               + (lengths == drafted).to(torch.int64))
        self._counts.index_add_(0, idx.reshape(-1),
                                (lengths <= drafted).to(torch.int64).reshape(-1))

    def cells(self, counts: list):
        """((class, width, length, accepted, real), count) of the nonzero cells."""
        G, W = self.G, self.W
        for i, n in enumerate(counts):
            if n:
                real, rest = i % 2, i // 2
                accepted, rest = rest % (G + 1), rest // (G + 1)
                length, rest = rest % (G + 1), rest // (G + 1)
                yield (CLASSES[rest // W], rest % W + 1, length, accepted, real), n

    def read_into(self, stats: dict, steps: int = 1) -> None:
        """The counts since the last read, made over ``steps`` engine steps, recorded per
        class as one window (a host read)."""
        now = self._counts.tolist()
        # class -> width -> ([(drafted, accepted, count)], [prefixes: (length, accepted, count)])
        by_class: dict = {}
        for (cls, width, length, accepted, real), n in self.cells(
                [a - b for a, b in zip(now, self.read)]):
            window = by_class.setdefault(cls, {}).setdefault(width, ([], []))
            window[1 - real].append((length, accepted, n))
        for cls, by_width in by_class.items():
            stats[cls].record_window(by_width, steps)
        self.read = now

    def verified(self) -> tuple[int, int]:
        """(drafts verified, draft tokens accepted) as of the last read."""
        drafts = accepted = 0
        for (_, _, length, k, real), n in self.cells(self.read):
            if real and length > 0:
                drafts += n
                accepted += n * k
        return drafts, accepted
