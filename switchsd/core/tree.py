"""Candidates -> a token trie for one verification forward.

Row 0 of the verify input is the *pending* token (the last committed token, not yet in the KV cache);
rows 1..n are trie nodes. Candidates that share a prefix share nodes, so no token is verified twice (deterministic drafts; sampled
draws with their q stay separate rows, see build_tree).
The paper's block-triangular mask (disjoint candidates) is the special case of a trie without shared
prefixes. Node order follows the candidates' priority (depth-first), so the first candidate's tokens are
contiguous rows 1..len and a fully accepted first candidate needs no KV gather.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass
class TokenTree:
    tokens: list[int]              # [n+1] row 0 = pending token
    parents: list[int]             # [n+1] parent row, -1 for row 0
    depths: list[int]              # [n+1] 0 for row 0
    children: list[list[int]]      # [n+1] child rows in priority order
    q: list[torch.Tensor | None] = field(default_factory=list)  # [n+1] draft dist the node's token came from
    cand_rows: list[list[int]] = field(default_factory=list)   # rows of each (kept) candidate
    cand_index: list[int] = field(default_factory=list)        # index in the input of each kept candidate

    @property
    def n_nodes(self) -> int:
        return len(self.tokens) - 1

    @property
    def is_chain(self) -> bool:
        return all(len(c) <= 1 for c in self.children)

    def path_to(self, row: int) -> list[int]:
        """Rows from the root's first child down to `row` (excluding row 0)."""
        path = []
        while row > 0:
            path.append(row)
            row = self.parents[row]
        return path[::-1]


def build_tree(pending: int, candidates: Sequence[Sequence[int]], budget: int,
               q: Sequence[Sequence[torch.Tensor]] | None = None, max_depth: int | None = None) -> TokenTree:
    """Merge candidates (priority order) into a trie of at most `budget` rows (row 0 included).

    `q[c][i]`: the draft distribution token `candidates[c][i]` was sampled from (None: a point mass).
    `max_depth` truncates every candidate (context length / max_new_tokens limits).
    """
    tree = TokenTree(tokens=[pending], parents=[-1], depths=[0], children=[[]], q=[None])
    for ci, cand in enumerate(candidates):
        row, rows = 0, []
        for i, tok in enumerate(cand):
            if max_depth is not None and i >= max_depth:
                break
            tok = int(tok)
            qi = None if q is None else q[ci][i]
            # sampled draws are never merged: i.i.d. siblings that drew the same token are separate trials
            # of the recursive rejection rule (merging them would bias the committed token)
            nxt = None if qi is not None else next(
                (c for c in tree.children[row] if tree.tokens[c] == tok and tree.q[c] is None), None)
            if nxt is None:
                if len(tree.tokens) >= budget:
                    break
                nxt = len(tree.tokens)
                tree.tokens.append(tok)
                tree.parents.append(row)
                tree.depths.append(tree.depths[row] + 1)
                tree.children.append([])
                tree.children[row].append(nxt)
                tree.q.append(qi)
            row = nxt
            rows.append(row)
        if rows:
            tree.cand_rows.append(rows)
            tree.cand_index.append(ci)
    return tree


def tree_mask(tree: TokenTree, prefix_len: int, dtype: torch.dtype, device, pad: int = 0) -> torch.Tensor:
    """Additive 4-D attention mask [1, 1, m, prefix_len + m] (m = n+1+pad): 0 = visible, dtype-min = hidden.

    Every row sees the whole cached prefix, its ancestors and itself — never other branches. `pad` extra rows
    (filler that makes the forward cheaper on some devices) see the prefix and themselves, and no real row
    sees them, so the real rows' outputs are those of the unpadded forward.
    """
    n1 = len(tree.tokens)
    m = n1 + pad
    anc = torch.zeros(m, m, dtype=torch.bool)
    for r in range(n1):  # parents come before children, so anc[parent] is complete
        if tree.parents[r] >= 0:
            anc[r] = anc[tree.parents[r]]
        anc[r, r] = True
    for r in range(n1, m):
        anc[r, r] = True
    visible = torch.cat([torch.ones(m, prefix_len, dtype=torch.bool), anc], dim=1)
    mask = torch.zeros(m, prefix_len + m, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask.to(device)[None, None]


def tree_positions(tree: TokenTree, prefix_len: int, device, pad: int = 0) -> torch.Tensor:
    """Position ids [1, n+1+pad]: the pending token sits at `prefix_len`, a node at prefix_len + depth
    (pad rows at prefix_len)."""
    return (torch.tensor(tree.depths + [0] * pad, dtype=torch.long) + prefix_len).to(device)[None]


def with_extra(mask: torch.Tensor, pos: torch.Tensor, prefix_len: int, extra) -> tuple[torch.Tensor, torch.Tensor]:
    """A tree's mask [1, 1, m, prefix+m] and positions [1, m] grown by a drafter's unverified rows (`Extra`, E
    of them): they see the prefix, the pending row (0) and the extra rows `extra.sees` marks; no earlier row
    sees them. -> mask [1, 1, m+E, prefix+m+E], positions [1, m+E]."""
    _, _, m, S = mask.shape
    E = len(extra.tokens)
    lo = torch.finfo(mask.dtype).min
    out = torch.full((1, 1, m + E, S + E), lo, dtype=mask.dtype, device=mask.device)
    out[:, :, :m, :S] = mask
    vis = torch.zeros(E, S + E, dtype=torch.bool)
    vis[:, :prefix_len] = True
    vis[:, prefix_len] = extra.sees[:, 0]
    vis[:, S:] = extra.sees[:, 1:]
    out[0, 0, m:].masked_fill_(vis.to(mask.device), 0.0)
    rel = torch.tensor(extra.rel_pos, dtype=pos.dtype, device=pos.device)
    return out, torch.cat([pos, prefix_len + rel[None]], 1)
