"""EAGLE-3 drafter: chain or EAGLE-2 dynamic-tree drafting from the head's own one-layer KV cache.

Alignment: the head's input at index t pairs the target's fused features g_t with the NEXT token x_{t+1},
sits at rotary position t, and predicts x_{t+2}. The target has processed (cached) tokens[:-1], so the
drafter can pair g_t with x_{t+1} for every t <= L-2; the output at t = L-2 predicts the token after the
pending one — the first draft token.

Lazy propagation: the engine hands over the target's features for every newly cached position after every
step (`add_features`), whether or not this drafter drafted. They wait in `pending` and enter the head's
stable KV cache in ONE batched forward at the next `propose`, the same forward whose last output starts the
draft. Draft-time K/V (from the head's own outputs) are temporary and dropped after each proposal.
"""
from __future__ import annotations

import copy
import weakref
from typing import Callable, Sequence

import torch

from ..core.config import SamplingConfig, TreeConfig
from ..core.drafting import Draft, DraftRequest
from ..core.verify import greedy_tokens, target_probs
from ..models.dense import attention_dtype
from .eagle3_model import Eagle3Head
from .eagle3_q8 import Q8Eagle3Head, q8_head


def target_dist(head: Eagle3Head, out: torch.Tensor, sampling: SamplingConfig, vocab: int) -> torch.Tensor:
    """Head output [..., H] -> the draft distribution over the TARGET vocabulary [..., V] (through d2t)."""
    q_draft = target_probs(head.logits(out), sampling)                  # [..., Vd]
    q = torch.zeros(*q_draft.shape[:-1], vocab, dtype=q_draft.dtype, device=q_draft.device)
    idx = torch.arange(q_draft.shape[-1], device=q_draft.device) + head.d2t
    return q.index_copy_(-1, idx, q_draft)


WIDE_ROWS = 8   # head forwards over this many rows or more may run a float32 copy (`wide_head`; 4 rows: a tie)


def wide_head(head: Eagle3Head) -> Eagle3Head | None:
    """A float32 copy of a 16-bit head on a CPU that only emulates 16-bit arithmetic (made once per head, kept
    while the head lives), for its forwards over several rows: the catch-up over the positions fed since the head last drafted,
    and the tree's levels. Emulated bfloat16 products grow with the rows (AVX2-only EPYC, the shipped head: a
    128-position catch-up took 67 ms in bfloat16 and 12 ms in float32), while a one-row drafting step is cheaper
    in bfloat16 (2.8 vs 4.9 ms), so chains keep the 16-bit head. None where the head's own dtype is fine."""
    w = head.fc.weight
    if attention_dtype(w.dtype, w.device) == w.dtype:
        return None
    if head not in _WIDE:
        _WIDE[head] = copy.deepcopy(head).float()
    return _WIDE[head]


_WIDE: "weakref.WeakKeyDictionary[Eagle3Head, Eagle3Head]" = weakref.WeakKeyDictionary()


CATCH_UP = 128


class Eagle3Drafter:
    name = "eagle3"
    path = "neural"

    def __init__(self, head: Eagle3Head, target, tree: TreeConfig = TreeConfig(), chain: bool = False,
                 gamma: int = 5, sampling: SamplingConfig = SamplingConfig(), generator: torch.Generator | None = None,
                 q8: bool = True, catch_up: int | None = CATCH_UP):
        """`q8`: on a CPU, draft through the head's Q8_0 copy (`q8_head`) where the kernels build.
        `catch_up`: at most this many of the latest pending positions enter the head's cache at a catch-up (None:
        all). After a long run of steps without neural drafts (the cost gate ran plain, or copies were committed)
        the head then pays a bounded forward to draft again, at the price of a gap in its own context (its keys
        keep their true positions). Drafts only: verification is unchanged."""
        self.head = (q8_head(head) if q8 else None) or head
        self.catch_up = catch_up
        self.tree, self.chain, self.gamma = tree, chain, gamma
        self.sampling = sampling
        self.generator = generator or torch.Generator().manual_seed(0)
        self.embed = target.get_input_embeddings()
        L = target.config.num_hidden_layers
        self.layers = head.config.layers_for(L)
        if not all(1 <= i <= L for i in self.layers):
            raise ValueError(f"EAGLE3 fused layers {self.layers} do not exist in a {L}-layer target")
        # input to layer i == output of layer i-1 (the "mlp" site of layer i-1)
        self.sites = tuple((i - 1, "mlp") for i in self.layers)
        self.vocab = target.config.vocab_size
        self.wide = wide_head(self.head)
        self._d2t = self.head.d2t.tolist()      # draft-to-target id offsets as host integers (`_chain_kv`)
        self.reset([])

    def _for_rows(self, n: int) -> Eagle3Head | None:
        """The float32 copy for a forward over n rows where it is faster (`wide_head`), else None."""
        return self.wide if self.wide is not None and n >= WIDE_ROWS else None

    def _step(self, emb: torch.Tensor, h: torch.Tensor, pos: torch.Tensor, k, v, mask):
        """head.step over emb/h [1, n, H], through the float32 copy where `_for_rows` says so, its outputs
        rounded back to the head's dtype (drafts only: verification decides what is kept)."""
        wide = self._for_rows(emb.shape[1])
        if wide is None:
            return self.head.step(emb, h, pos, k, v, mask)
        f = torch.float32
        o, k1, v1 = wide.step(emb.to(f), h.to(f), pos, None if k is None else k.to(f),
                                   None if v is None else v.to(f), mask)
        dt = self.head.fc.weight.dtype
        return o.to(dt), k1.to(dt), v1.to(dt)

    # -- protocol ------------------------------------------------------------------------------------------
    def reset(self, tokens: Sequence[int]) -> None:
        self.k = self.v = None          # stable KV [1, kvh, S, hd]; S <= positions paired (gaps: `catch_up`)
        # the Q8 head on a CPU writes its K/V in place (self.k, self.v: views of the first S entries)
        self.kv = self.head.new_cache() if isinstance(self.head, Q8Eagle3Head) else None
        self.paired = 0                 # positions paired so far (the next catch-up starts here)
        self.pending: list[list[torch.Tensor]] = []   # per step, the fused layers' features [n, Ht] each, not yet
                                                      # in the stable cache (joined at the next catch-up)
        self.pending_rows = 0
        self.last_out: torch.Tensor | None = None   # output at the last paired position [H]
        self.tokens = tokens
        self.held: tuple[Draft, list[float]] | None = None     # this step's confident_chain, for propose

    def extend(self, tokens: Sequence[int], n_new: int) -> None:
        self.tokens = tokens
        self.held = None

    def add_features(self, feats: dict) -> None:
        self.held = None
        # with device_map the fused layers may sit on different GPUs: gather them on the head's device
        dev = self.head.fc.weight.device
        self.pending.append([feats[s].to(dev) for s in self.sites])          # low, mid, high: [n, Ht] each
        self.pending_rows += self.pending[-1][0].shape[0]
        while self.catch_up is not None and self.pending_rows - self.pending[0][0].shape[0] >= self.catch_up:
            n = self.pending.pop(0)[0].shape[0]          # older than the catch-up window: never fed, paired as gaps
            self.pending_rows -= n
            self.paired += n

    @property
    def synced(self) -> int:
        """Positions paired so far: the rotary position of the next head input."""
        return self.paired

    @property
    def cached(self) -> int:
        """Entries in the head's stable KV cache."""
        return 0 if self.k is None else self.k.shape[2]

    # -- drafting ------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _catch_up(self) -> torch.Tensor:
        """Feed the pending (g_t, x_{t+1}) pairs in one forward; returns the last output [H]."""
        g = torch.cat([torch.cat(parts, 0) for parts in zip(*self.pending)], -1)   # [n, 3Ht] low|mid|high
        self.pending, self.pending_rows = [], 0
        start, n = self.paired, g.shape[0]
        self.paired += n
        if self.catch_up is not None and n > self.catch_up:          # only the latest positions enter the cache
            start, n, g = start + n - self.catch_up, self.catch_up, g[n - self.catch_up:]
        if self.kv is not None:         # C calls straight into the cache: no copies of the past
            S = self.cached
            emb = self.embed.weight[self.tokens[start + 1:start + 1 + n]].float()          # [n, H]
            out = self.head.run(emb, self.head.fused(g.float()), start, self.kv, S)
            self.k, self.v = self.kv.views(S + n)
            self.last_out = out[-1]
            return self.last_out
        dev = g.device
        toks = torch.tensor(self.tokens[start + 1:start + 1 + n], device=self.embed.weight.device)
        fc = (self._for_rows(n) or self.head).fc
        h = fc(g.to(fc.weight.dtype)).to(self.head.fc.weight.dtype)[None]   # [1, n, H]
        emb = self._embed(toks)[None]                                   # [1, n, H]
        pos = torch.arange(start, start + n, device=dev)
        out, k, v = self._step(emb, h, pos, self.k, self.v, None)
        self.k = k if self.k is None else torch.cat([self.k, k], 2)
        self.v = v if self.v is None else torch.cat([self.v, v], 2)
        self.last_out = out[0, -1]
        return self.last_out

    @torch.inference_mode()
    def q_along(self, hidden_states, tokens: Sequence[int]) -> torch.Tensor:
        """The head's one-step draft law over the target vocabulary at every position of a teacher-forced
        sequence, [T-1, V]: row t pairs the target features at t with token t+1 and gives the q of token t+2,
        the law a step whose pending token is t+1 draws its first token from. `hidden_states`: the target's
        output_hidden_states over `tokens` (T of them). The drafter's own state is not touched."""
        dev = self.head.fc.weight.device
        g = torch.cat([hidden_states[s[0] + 1][0, :-1].to(dev) for s in self.sites], -1)        # [T-1, 3Ht]
        h = self.head.fc(g.to(self.head.fc.weight.dtype))[None]
        emb = self._embed(torch.tensor(list(tokens[1:]), device=self.embed.weight.device))[None]
        out, _, _ = self.head.step(emb, h, torch.arange(len(tokens) - 1, device=dev), None, None, None)
        return self._dist(out[0])

    def _embed(self, toks: torch.Tensor) -> torch.Tensor:
        """Target token embeddings [..., H] on the head's device (the embedding may live on another GPU)."""
        w = self.head.fc.weight
        return self.embed(toks.to(self.embed.weight.device)).to(w.device, w.dtype)

    def _dist(self, out: torch.Tensor) -> torch.Tensor:
        return target_dist(self.head, out, self.sampling, self.vocab)

    @torch.inference_mode()
    def propose(self, req: DraftRequest) -> Draft:
        if self.held is not None:       # the cost gate drafted this step's chain already (confident_chain)
            draft = self.held[0]
            n = min(req.max_len, len(draft.candidates[0]))
            return Draft([draft.candidates[0][:n]], q=[draft.q[0][:n]] if draft.q else None) if n > 0 else Draft([])
        last = self._ready(req)
        if last is None:
            return Draft([])
        base = self.synced        # position of the first draft input (it carries the first draft token)
        if self.chain or self.tree.top_k == 1:
            return self._chain(last, base, min(self.gamma, req.max_len))[0]
        return self._tree(last, base, req)

    @torch.inference_mode()
    def confident_chain(self, req: DraftRequest, keep: Callable[[int, float], bool]) -> tuple[Draft, list[float]]:
        """A chain of at most min(gamma, max_len) tokens, drafted one by one while `keep(i, c_i)` says go on;
        c_i = the head's probability of draft token i (its top-1 probability when greedy). Held for this step's
        `propose`, which returns a prefix of it (no second drafting)."""
        self.held = None
        last = self._ready(req)
        if last is None:
            return Draft([]), []
        self.held = self._chain(last, self.synced, min(self.gamma, req.max_len), keep)
        return self.held

    def _ready(self, req: DraftRequest) -> torch.Tensor | None:
        """The head's output the draft starts from [H], after feeding the pending features; None: no draft.
        Proposing twice without a commit in between (e.g. a shadow analysis) reuses the last output."""
        if req.max_len < 1 or (not self.pending and self.last_out is None):
            return None
        return self._catch_up() if self.pending else self.last_out

    def _chain(self, out: torch.Tensor, base: int, n: int,
               keep: Callable[[int, float], bool] | None = None) -> tuple[Draft, list[float]]:
        if self.kv is not None and self.sampling.greedy:
            return self._chain_kv(out, base, n, keep)
        toks, qs, conf = [], [], []     # greedy: token tensors, read back in one host sync at the end
        k, v = self.k, self.v
        greedy = self.sampling.greedy
        for i in range(n):
            if greedy:
                logits = self.head.logits(out)                                                # [Vd]
                tok = self.head.to_target_ids(greedy_tokens(logits)).view(1)                      # [1] on device
                if keep is not None:        # a host sync per token: the price of stopping early
                    conf.append(float(torch.softmax(logits.float(), -1).max()))
            else:
                q = self._dist(out).float().cpu()
                tok = torch.multinomial(q, 1, generator=self.generator)
                qs.append(q)
                if keep is not None:
                    conf.append(float(q[tok]))
            toks.append(tok)
            if i == n - 1 or (keep is not None and not keep(i + 1, conf[-1])):
                break
            emb = self._embed(tok.to(out.device))[None]
            o, k1, v1 = self.head.step(emb, out[None, None], torch.tensor([base + i], device=out.device), k, v, None)
            k, v = torch.cat([k, k1], 2), torch.cat([v, v1], 2)
            out = o[0, -1]
        return Draft([torch.cat(toks).tolist()], q=[qs] if qs else None), conf

    def _chain_kv(self, out: torch.Tensor, base: int, n: int,
                  keep: Callable[[int, float], bool] | None) -> tuple[Draft, list[float]]:
        """`_chain` at T = 0 for the Q8 head on a CPU: host integers, the draft's K/V past the stable entries."""
        toks: list[int] = []
        conf: list[float] = []
        S = self.cached
        for i in range(n):
            logits = self.head.logits(out)                                                    # [Vd]
            d = int(greedy_tokens(logits))
            toks.append(d + self._d2t[d])
            if keep is not None:
                conf.append(float(torch.softmax(logits.float(), -1).max()))
            if i == n - 1 or (keep is not None and not keep(i + 1, conf[-1])):
                break
            emb = self.embed.weight[toks[-1]].float()[None]                                   # [1, H]
            out = self.head.run(emb, out[None], base + i, self.kv, S + i)[0]
        return Draft([toks]), conf

    def _tree(self, out: torch.Tensor, base: int, req: DraftRequest) -> Draft:
        """EAGLE-2: expand the top_k best nodes per level by cumulative log-prob, then keep the best
        `total_tokens` nodes overall (a child never outranks its parent). Nodes are point masses."""
        K, D = self.tree.top_k, min(self.tree.depth, req.max_len)
        N = min(self.tree.total_tokens, req.budget)
        dev = out.device
        S = self.cached
        # candidate nodes: token (target id), parent (-1 root), score. The frontier's tokens and scores stay on
        # the device; each level reads its candidates back in ONE host transfer.
        logp = torch.log_softmax(self.head.logits(out).float(), -1)
        top = logp.topk(K)
        f_tok, f_score = self.head.to_target_ids(top.indices), top.values        # [K] each, on the device
        host = torch.cat([f_tok.double(), f_score.double()]).tolist()
        tok_l, par_l, score_l = [int(t) for t in host[:K]], [-1] * K, host[K:]
        frontier = list(range(K))                 # node ids of the current level
        f_h = out[None].expand(K, -1)             # hidden input per frontier node [K, H]
        temp_k = temp_v = None                    # K/V of expanded nodes [1, kvh, E, hd]
        anc_rows = torch.zeros(K, 0, dtype=torch.bool, device=dev)   # frontier node -> temp entries it sees
        for d in range(1, D):
            n_f = len(frontier)
            rows = torch.cat([anc_rows, torch.eye(n_f, dtype=torch.bool, device=dev)], 1)   # [n_f, E+n_f]
            mask = torch.cat([torch.ones(n_f, S, dtype=torch.bool, device=dev), rows], 1)
            pk = self.k if temp_k is None else torch.cat([self.k, temp_k], 2)
            pv = self.v if temp_v is None else torch.cat([self.v, temp_v], 2)
            emb = self._embed(f_tok)[None]                                     # [1, n_f, H]
            pos = torch.full((n_f,), base + d - 1, device=dev)
            o, k1, v1 = self._step(emb, f_h[None], pos, pk, pv, mask)
            temp_k = k1 if temp_k is None else torch.cat([temp_k, k1], 2)
            temp_v = v1 if temp_v is None else torch.cat([temp_v, v1], 2)
            wide = self._for_rows(n_f)
            lp = torch.log_softmax((wide or self.head).logits(o[0].to(torch.float32) if wide else o[0]).float(), -1)
            cand = lp.topk(K, -1)
            flat = (f_score[:, None] + cand.values).flatten()                   # [n_f * K] cumulative log-probs
            ids = self.head.to_target_ids(cand.indices).flatten()               # [n_f * K]
            best_t = flat.topk(min(K, flat.numel())).indices                    # the next frontier
            m = flat.numel()
            host = torch.cat([ids.double(), flat.double(), best_t.double()]).tolist()   # the level's one sync
            first_new = len(tok_l)
            tok_l += [int(t) for t in host[:m]]
            par_l += [frontier[idx // K] for idx in range(m)]
            score_l += host[m:2 * m]
            frontier = [first_new + int(b) for b in host[2 * m:]]
            parents_local = best_t // K
            anc_rows = rows[parents_local]                     # a child sees its parent's row (ancestors + parent)
            f_h = o[0, parents_local]
            f_tok, f_score = ids[best_t], flat[best_t]
        # re-rank: the N best nodes overall, parents before children
        order = sorted(range(len(tok_l)), key=lambda i: (-score_l[i], i))
        chosen: set[int] = set()
        for i in order:
            if len(chosen) >= N:
                break
            if par_l[i] == -1 or par_l[i] in chosen:
                chosen.add(i)
        leaves = [i for i in chosen if not any(par_l[j] == i for j in chosen)]
        leaves.sort(key=lambda i: -score_l[i])
        cands = []
        for leaf in leaves:
            path, i = [], leaf
            while i != -1:
                path.append(tok_l[i])
                i = par_l[i]
            cands.append(path[::-1])
        return Draft(cands)
