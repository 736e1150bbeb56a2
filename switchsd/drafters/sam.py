"""SAM-Decoding's copy drafter (SAMD, arXiv 2411.10666; notes: ../shared/research/copy_baselines.md section 4):
an incremental suffix automaton over prompt + generated tokens finds, after every token, the longest suffix of
the text that occurred earlier, and drafts the continuation of its EARLIEST occurrence.

The automaton (`SuffixAutomaton`) is the textbook online construction: one state per equivalence class of end
positions, `link` the suffix link, `first` the end position of the class's first occurrence (clones inherit it),
amortised O(1) states and transitions per token. Matching runs BEFORE a token is added, so the match always ends
at an earlier position: state `cur` and length `length` describe the longest suffix of text[:n] that occurs in
text[:n-1]. When a clone takes over the shorter lengths of the matched state, the match moves to it.

SAMD's rule (the policy, `core/policies.py::SAMD`): the SAM's chain of `n_predicts` tokens when the match is at
least `len_threshold` long, else the auxiliary drafter (here the EAGLE-3 head); without one, the SAM drafts
min(n_predicts, 1 + alpha * match) tokens. Spec-Bench's settings: n_predicts 40, len_threshold 5 (len_bias
only applies to the static corpus automaton, which is not used there, nor here).
"""
from __future__ import annotations

from typing import Sequence

from ..core.drafting import Draft, DraftRequest


class SuffixAutomaton:
    def __init__(self):
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.len: list[int] = [0]
        self.first: list[int] = [-1]          # end position (index into the text) of the first occurrence
        self.last = 0
        self.text: list[int] = []
        self.cur, self.length = 0, 0          # the match: longest suffix of text that occurs earlier

    def _state(self, length: int, link: int, first: int, nxt: dict | None = None) -> int:
        self.next.append(nxt if nxt is not None else {})
        self.link.append(link)
        self.len.append(length)
        self.first.append(first)
        return len(self.len) - 1

    def _match(self, c: int) -> None:
        """Advance the match by token c against the automaton of the text so far (before c is added)."""
        s, n = self.cur, self.length
        while s != -1 and c not in self.next[s]:
            s = self.link[s]
            n = self.len[s] if s != -1 else 0
        if s == -1:
            self.cur, self.length = 0, 0
        else:
            self.cur, self.length = self.next[s][c], n + 1

    def _add(self, c: int) -> None:
        pos = len(self.text)
        self.text.append(c)
        cur = self._state(self.len[self.last] + 1, -1, pos)
        p = self.last
        while p != -1 and c not in self.next[p]:
            self.next[p][c] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][c]
            if self.len[p] + 1 == self.len[q]:
                self.link[cur] = q
            else:
                clone = self._state(self.len[p] + 1, self.link[q], self.first[q], dict(self.next[q]))
                while p != -1 and self.next[p].get(c) == q:
                    self.next[p][c] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur
        # a clone may now hold the matched length: move the match to the state whose lengths contain it
        while self.cur > 0 and self.length <= self.len[self.link[self.cur]]:
            self.cur = self.link[self.cur]

    def push(self, c: int) -> None:
        self._match(c)
        self._add(c)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens[len(self.text):]:
            self.push(int(t))

    def continuation(self, want: int) -> tuple[int, int]:
        """(start, match length) of the copy: the earliest occurrence of the match, climbing suffix links (shorter
        matches, earlier occurrences) while its continuation is shorter than `want` (SAMD's rule)."""
        s, n = self.cur, self.length
        end = len(self.text) - 1
        while s > 0 and end - self.first[s] < want and self.link[s] > 0:
            s = self.link[s]
            n = self.len[s]
        if s <= 0 or n == 0:
            return -1, 0
        return self.first[s] + 1, n


class SAMDrafter:
    """The SAM's chain draft; `match_len` is what SAMD's rule reads."""
    name, path = "samd", "copy"

    def __init__(self, n_predicts: int = 40, alpha: float = 4.0):
        self.n_predicts, self.alpha = n_predicts, alpha
        self.sam = SuffixAutomaton()

    def reset(self, tokens: Sequence[int]) -> None:
        self.sam = SuffixAutomaton()
        self.sam.extend(tokens)

    def extend(self, tokens: Sequence[int], n_new: int) -> None:
        self.sam.extend(tokens)

    @property
    def match_len(self) -> int:
        return self.sam.length

    def propose(self, req: DraftRequest) -> Draft:
        self.sam.extend(req.tokens)
        want = min(self.n_predicts, req.max_len, req.budget)
        if want < 1:
            return Draft([])
        start, n = self.sam.continuation(self.n_predicts)
        if n == 0:
            return Draft([])
        text = self.sam.text
        cand = text[start:start + want]
        return Draft([cand], match={"ngram": text[len(text) - n:], "sources": [start]}) if cand else Draft([])
