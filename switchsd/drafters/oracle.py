"""Oracle drafter: proposes the target's own greedy continuation (known from a vanilla run of the same prompt),
as one chain filling the verification budget. At T = 0 it accepts everything it proposes: the speed it reaches
is the upper bound of speculative decoding with this budget on this hardware."""
from __future__ import annotations

from typing import Sequence

from ..core.drafting import Draft, DraftRequest


class OracleDrafter:
    name = "oracle"
    path = "oracle"

    def __init__(self, reference: Sequence[int]):
        self.reference = list(reference)    # prompt + vanilla output

    def reset(self, tokens: Sequence[int]) -> None:
        pass

    def extend(self, tokens: Sequence[int], n_new: int) -> None:
        pass

    def propose(self, req: DraftRequest) -> Draft:
        L = len(req.tokens)
        if list(req.tokens) != self.reference[:L]:
            return Draft([])                  # off the reference path (T > 0): no draft
        return Draft([self.reference[L:L + min(req.max_len, req.budget)]])
