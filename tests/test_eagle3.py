"""EAGLE3: loader (published layout, .bin and safetensors, d2t offsets, clear errors), exactness of chain and
tree drafting against vanilla greedy, and lazy propagation after copy steps."""
from __future__ import annotations

import json

import pytest
import torch
from helpers import greedy_reference, random_prompt, repetitive_prompt
from safetensors.torch import save_file

from switchsd.core.config import CopyConfig, EngineConfig, NeuralConfig
from switchsd.core.drafting import Draft, DraftRequest
from switchsd.core.policies import Decision, PolicyState
from switchsd.drafters.copy import CopyDrafter
from switchsd.drafters.eagle3 import Eagle3Drafter, TreeConfig
from switchsd.drafters.eagle3_model import Eagle3LoadError, load_eagle3
from switchsd.factory import make_engine
from switchsd.methods import build_policy

H, V, VD = 32, 64, 40


def published_state_dict(seed: int = 0, hidden: int = H, vocab: int = V, vd: int = VD) -> tuple[dict, dict]:
    """Random weights under the exact published key names (SafeAILab cnets.py / SpecForge export)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.2
    heads, kv, hd, inter = 4, 2, hidden // 4, 64
    used = torch.randperm(vocab, generator=g)[:vd].sort().values
    sd = {
        "fc.weight": r(hidden, 3 * hidden),
        "midlayer.input_layernorm.weight": 1 + r(hidden),
        "midlayer.hidden_norm.weight": 1 + r(hidden),
        "midlayer.self_attn.q_proj.weight": r(heads * hd, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": r(kv * hd, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": r(kv * hd, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": r(hidden, heads * hd),
        "midlayer.post_attention_layernorm.weight": 1 + r(hidden),
        "midlayer.mlp.gate_proj.weight": r(inter, hidden),
        "midlayer.mlp.up_proj.weight": r(inter, hidden),
        "midlayer.mlp.down_proj.weight": r(hidden, inter),
        "norm.weight": 1 + r(hidden),
        "lm_head.weight": r(vd, hidden),
        "d2t": used - torch.arange(vd),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, used, True),
    }
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv,
           "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": vd, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 2048, "hidden_act": "silu", "tie_word_embeddings": False}
    return sd, cfg


def write_head(folder, fmt="safetensors", **kw):
    sd, cfg = published_state_dict(**kw)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(sd, folder / "pytorch_model.bin")
    return sd


@pytest.fixture(scope="module")
def target():
    """6 layers, so the default fused layers (2, L//2, L-3) = (2, 3, 3) exist."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256, eos_token_id=1)
    return LlamaForCausalLM(cfg).to(torch.float64).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def head(tmp_path_factory, target):
    folder = tmp_path_factory.mktemp("head")
    write_head(folder)
    return load_eagle3(str(folder), target)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_loader_published_layout(tmp_path, target, fmt):
    sd = write_head(tmp_path, fmt)
    head = load_eagle3(str(tmp_path), target)
    for k, v in sd.items():
        assert torch.equal(head.state_dict()[k].to(v.dtype), v), k
    assert head.fc.weight.shape == (H, 3 * H)
    assert head.midlayer.self_attn.q_proj.weight.shape[1] == 2 * H
    # d2t maps every draft id to the target id it stands for
    draft_ids = torch.arange(VD)
    target_ids = head.to_target_ids(draft_ids)
    assert torch.equal(target_ids, torch.nonzero(sd["t2d"]).flatten())
    assert head.config.rope_theta == 10000.0          # absent in the config: the official trainer's base
    assert head.config.layers_for(6) == (2, 3, 3)
    assert head.fc.weight.dtype == torch.float64      # cast to the target's dtype


def test_loader_prefix_variants_and_missing_embed(tmp_path, target):
    sd, cfg = published_state_dict()
    sd = {("model.layers.0." + k[len("midlayer."):]) if k.startswith("midlayer.") else k: v for k, v in sd.items()}
    sd["embed_tokens.weight"] = torch.zeros(V, H)      # present in some exports; always taken from the target
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(sd, str(tmp_path / "model.safetensors"))
    head = load_eagle3(str(tmp_path), target)
    loaded = head.state_dict()
    assert not any("embed" in k for k in loaded), "an exported embedding must not replace the target's"
    for k, v in sd.items():                          # "model.layers.0." read as the published "midlayer."
        if k != "embed_tokens.weight":
            name = "midlayer." + k[len("model.layers.0."):] if k.startswith("model.layers.0.") else k
            assert torch.equal(loaded[name].to(v.dtype), v), k


@pytest.mark.parametrize("change,msg", [({"hidden": 48}, "hidden size"), ({"vocab": 80}, "vocabulary")])
def test_loader_rejects_mismatched_head(tmp_path, target, change, msg):
    write_head(tmp_path, **change)
    with pytest.raises(Eagle3LoadError, match=msg):
        load_eagle3(str(tmp_path), target)


def test_loader_rejects_wrong_shapes(tmp_path, target):
    sd = write_head(tmp_path)
    sd["lm_head.weight"] = torch.zeros(VD + 1, H)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(Eagle3LoadError, match="lm_head.weight"):
        load_eagle3(str(tmp_path), target)


def test_loader_missing_folder_is_clear(target):
    with pytest.raises(Eagle3LoadError):
        load_eagle3("/nonexistent/eagle3-head", target)


def eagle_engine(target, head, chain, budget=16, max_new=30, method="eagle3", **tree):
    drafter = Eagle3Drafter(head, target, TreeConfig(**tree) if tree else TreeConfig(), chain=chain, gamma=4)
    policy = build_policy(method, (), CopyConfig(), drafter,       # the drafter's own shape, every step
                          neural_cfg=NeuralConfig(shape="chain" if chain else "tree"))
    return make_engine(target, policy, EngineConfig(max_new_tokens=max_new, budget=budget, stop_at_eos=False), ())


@pytest.mark.parametrize("chain", [True, False])
@pytest.mark.parametrize("method", ["eagle3", "copyspec"])
def test_eagle3_greedy_equals_vanilla(target, trained_head, chain, method):
    """With a head that agrees with the target (the trained fixture), so that accepted drafts, not only rejected
    ones, are checked against vanilla; CopySpec's copy steps in between exercise the head's lazy catch-up."""
    accepted = 0
    for seed in range(4):
        ids = repetitive_prompt(seed) if seed % 2 else random_prompt(300 + seed, 6 + seed % 5)
        want = greedy_reference(target, ids, 30, eos=None)
        res = eagle_engine(target, trained_head, chain, method=method).run(ids)
        assert res.token_ids == want
        accepted += sum(len(e.accepted) for e in res.events if e.path == "neural")
        if method == "eagle3":
            assert all(e.path == "neural" for e in res.events[:-1])  # the last may have no room to draft
            if not chain:
                assert any(len(e.tree_tokens) > 2 and len(e.candidates) > 1 for e in res.events)
    assert accepted >= 10, accepted    # accepted drafts equal vanilla too (an untrained head: ~1 in 400 accepted)


class Alternate:
    """Copy step whenever the copy drafter matches, else EAGLE3: exercises lazy propagation."""

    def __init__(self, copy, eagle):
        self.drafters = [copy, eagle]
        self.snapshots = []

    def select(self, state: PolicyState):
        return Decision(tuple(self.drafters))

    def observe(self, event):
        pass


def test_lazy_propagation_matches_fresh_head(target, head):
    """After copy steps, the head's catch-up output equals a head re-run from scratch on the same tokens."""
    eagle = Eagle3Drafter(head, target, chain=True, gamma=3, catch_up=None)
    copy = CopyDrafter(CopyConfig(kappa=3))
    engine = make_engine(target, Alternate(copy, eagle), EngineConfig(max_new_tokens=40, budget=12, stop_at_eos=False), ())
    ids = repetitive_prompt(5, n=16, reps=3, tail=4)
    paths = []
    for ev in engine.generate(ids):
        paths.append(ev.path)
    assert "copy" in paths and "neural" in paths
    # state after the last commit: eagle has pending features of every cached position since its last draft
    tokens = list(eagle.tokens)
    assert len(eagle.pending) >= 1
    incremental = eagle._catch_up()
    fresh = Eagle3Drafter(head, target, chain=True, gamma=3, catch_up=None)
    fresh.reset(tokens)
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
    fresh.add_features({(i - 1, "mlp"): hs[i][0] for i in fresh.layers})
    assert fresh.sites == eagle.sites
    scratch = fresh._catch_up()
    torch.testing.assert_close(incremental, scratch, rtol=1e-9, atol=1e-9)
    assert eagle.synced == fresh.synced == len(tokens) - 1


def test_catch_up_window_keeps_the_latest_positions_at_their_own_places(target, head):
    """A catch-up over more pending positions than the window feeds only the latest ones, at their true rotary
    positions: the output equals the head run from an empty cache over those pairs alone, the cache holds the
    window, and the next input's position counts every paired position."""
    ids = random_prompt(3, 40)
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True).hidden_states
    d = Eagle3Drafter(head, target, chain=True, gamma=3, catch_up=8)
    d.reset(ids)
    d.add_features({(i - 1, "mlp"): hs[i][0] for i in d.layers})
    out = d._catch_up()
    n = len(ids) - 1
    assert (d.synced, d.cached) == (n, 8)
    g = torch.cat([hs[i][0, n - 8:] for i in d.layers], -1)
    emb = d._embed(torch.tensor(ids[n - 8 + 1:n + 1]))[None]
    ref, _, _ = head.step(emb, head.fc(g.to(head.fc.weight.dtype))[None], torch.arange(n - 8, n), None, None, None)
    torch.testing.assert_close(out, ref[0, -1], rtol=1e-9, atol=1e-9)
    full = Eagle3Drafter(head, target, chain=True, gamma=3, catch_up=None)
    full.reset(ids)
    full.add_features({(i - 1, "mlp"): hs[i][0] for i in full.layers})
    assert not torch.allclose(full._catch_up(), out)          # the window did drop context
    assert d.propose(DraftRequest(tokens=ids, max_len=3, budget=8))          # and it drafts from there


def test_tree_respects_budget_and_depth(target, head):
    d = Eagle3Drafter(head, target, TreeConfig(top_k=3, depth=4, total_tokens=50))
    ids = random_prompt(1, 12)
    d.reset(ids)
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True).hidden_states
    d.add_features({(i - 1, "mlp"): hs[i][0] for i in d.layers})
    draft = d.propose(DraftRequest(tokens=ids, max_len=3, budget=7))
    nodes = {tuple(c[:i + 1]) for c in draft.candidates for i in range(len(c))}
    assert len(nodes) <= 7
    assert max(len(c) for c in draft.candidates) <= 3


def test_tree_reads_back_once_per_level(target, head, monkeypatch):
    """On a GPU every tensor -> Python conversion waits for the device: the tree drafts with one per level."""
    g = torch.Generator().manual_seed(5)
    toks = torch.randint(0, V, (15,), generator=g).tolist()
    hs = target(input_ids=torch.tensor([toks]), output_hidden_states=True).hidden_states
    d = Eagle3Drafter(head, target, TreeConfig(4, 5, 24))
    d.reset(toks)
    d.add_features({s: hs[s[0] + 1][0, :-1] for s in d.sites})
    calls = {"tolist": 0, "scalar": 0}
    real_tolist = torch.Tensor.tolist

    def counting_tolist(self):
        calls["tolist"] += 1
        return real_tolist(self)

    def scalar(kind):
        real = getattr(torch.Tensor, kind)

        def f(self, *a):
            calls["scalar"] += 1
            return real(self, *a)
        return f
    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    for kind in ("__int__", "__float__", "item", "__index__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, kind, scalar(kind))
    draft = d.propose(DraftRequest(tokens=toks, max_len=8, budget=31))
    monkeypatch.undo()
    assert draft and calls["scalar"] == 0 and calls["tolist"] == 5      # depth 5: the root level + 4 expansions


def test_loader_speculators_layout_and_clear_config_errors(tmp_path, target):
    """vLLM speculators nest the layer's fields in transformer_layer_config (with layers.0.* keys): read the same
    head; its norm_before_residual variant and a config without the needed fields are clear errors."""
    sd, cfg = published_state_dict()
    folder = tmp_path / "spec"
    folder.mkdir()
    layer = {k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                 "vocab_size", "rms_norm_eps", "max_position_embeddings")}
    spec_cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                "transformer_layer_config": layer, "draft_vocab_size": cfg["draft_vocab_size"],
                "target_hidden_size": H, "norm_before_residual": False}
    (folder / "config.json").write_text(json.dumps(spec_cfg))
    keys = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in sd.items()}
    save_file({k: v.contiguous() for k, v in keys.items()}, str(folder / "model.safetensors"))
    ref = tmp_path / "ref"
    write_head(ref)
    a, b = load_eagle3(str(folder), target), load_eagle3(str(ref), target)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    (folder / "config.json").write_text(json.dumps({**spec_cfg, "norm_before_residual": True}))
    with pytest.raises(Eagle3LoadError, match="norm_before_residual"):
        load_eagle3(str(folder), target)
    (folder / "config.json").write_text(json.dumps({"architectures": ["Eagle3Speculator"]}))
    with pytest.raises(Eagle3LoadError, match="lacks the field"):
        load_eagle3(str(folder), target)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(Eagle3LoadError, match="JSON object"):
        load_eagle3(str(folder), target)


def test_q_along_is_the_q_the_drafter_draws_from(target, head):
    """Row t of q_along is the law the drafter's first token comes from when token t+1 is pending: the
    studio's verification lab and the EASD calibration read q this way."""
    g = torch.Generator().manual_seed(9)
    toks = torch.randint(0, V, (14,), generator=g).tolist()
    hs = target(input_ids=torch.tensor([toks]), output_hidden_states=True).hidden_states
    from switchsd.core.config import SamplingConfig
    d = Eagle3Drafter(head, target, chain=True, gamma=1, sampling=SamplingConfig(0.7))
    qa = d.q_along(hs, toks)                                                  # [T-1, V]
    for L in (5, 9, 14):                                                      # pending token L-1
        d.reset(toks[:L])
        d.add_features({s: hs[s[0] + 1][0, :L - 1] for s in d.sites})
        assert torch.allclose(d._dist(d._catch_up()), qa[L - 2], atol=1e-12)


def test_smc_particles_draw_from_the_heads_own_laws(target, head):
    """SMC-SD's EAGLE-3 particles (drafters/particles.py): each cycle's first draft law equals q_along (the head fed
    the target's features of every kept position), the in-cycle drafts equal Eagle3Drafter's chain laws, and
    particles that resample carry their ancestor's state."""
    from switchsd.core.config import SamplingConfig
    from switchsd.drafters.particles import Eagle3Particles
    g = torch.Generator().manual_seed(4)
    toks = torch.randint(0, V, (16,), generator=g).tolist()
    hs = target(input_ids=torch.tensor([toks]), output_hidden_states=True).hidden_states
    qa = Eagle3Drafter(head, target, chain=True, gamma=1, sampling=SamplingConfig(0.7)).q_along(hs, toks)
    P = Eagle3Particles(head, target, 0.7)
    L, gamma = 8, 3
    P.start(toks[:L - 1], torch.tensor([toks[L - 1]] * 2), tuple(h[:, :L - 1] for h in hs))
    q = P.draft(torch.tensor([toks[L - 1]] * 2))
    assert torch.allclose(q.double(), qa[L - 2].expand(2, -1), atol=1e-6)
    # in-cycle drafts: the chain drafter's own draft (its tokens and laws); the particles fed the same tokens agree
    d = Eagle3Drafter(head, target, chain=True, gamma=gamma, sampling=SamplingConfig(0.7),
                      generator=torch.Generator().manual_seed(1))
    d.reset(toks[:L])
    d.add_features({s: hs[s[0] + 1][0, :L - 1] for s in d.sites})
    draft = d.propose(DraftRequest(tokens=toks[:L], max_len=gamma, budget=8))
    xs, laws = draft.candidates[0], draft.q[0]
    assert torch.allclose(laws[0].double(), q[0].double(), atol=1e-6)
    for j in range(1, gamma):
        assert torch.allclose(P.draft(torch.tensor([xs[j - 1]] * 2)).double(), laws[j].double().expand(2, -1),
                              atol=1e-6)
    toks = toks[:L] + xs + toks[L + gamma:]
    hs = target(input_ids=torch.tensor([toks]), output_hidden_states=True).hidden_states
    qa = Eagle3Drafter(head, target, chain=True, gamma=1, sampling=SamplingConfig(0.7)).q_along(hs, toks)
    # the cycle ends: the target verified (pending, drafts); the next cycle's first law is q_along again
    block = torch.tensor([toks[L - 1:L + gamma]] * 2)
    P.observe(block, tuple(h[:, L - 1:L + gamma].expand(2, -1, -1) for h in hs))
    P.reorder(torch.tensor([1, 1]))
    q = P.draft(torch.tensor([toks[L + gamma]] * 2))
    assert torch.allclose(q.double(), qa[L + gamma - 1].expand(2, -1), atol=1e-6)


def _head_ready(target, head, ids, tree):
    d = Eagle3Drafter(head, target, tree)
    d.reset(ids)
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True).hidden_states
    d.add_features({(i - 1, "mlp"): hs[i][0] for i in d.layers})
    return d


def eagle2_reference(d, K: int, D: int, N: int) -> set[tuple[int, ...]]:
    """EAGLE-2's dynamic tree computed the slow way: every node's distribution from a fresh sequential pass of
    the head along its own path (no tree mask), the frontier = the K best children of the previous level by
    cumulative log-prob, then the N best nodes overall with parents before children."""
    out0 = d._catch_up()
    S = d.synced

    def logp_after(path):                    # path: draft-vocab ids
        out, k, v = out0, d.k, d.v
        for i, t in enumerate(path):
            tok = d.head.to_target_ids(torch.tensor([t]))
            o, k1, v1 = d.head.step(d._embed(tok)[None], out[None, None], torch.tensor([S + i]), k, v, None)
            k, v, out = torch.cat([k, k1], 2), torch.cat([v, v1], 2), o[0, -1]
        return torch.log_softmax(d.head.logits(out).double(), -1)

    nodes = {}                               # draft-id path -> cumulative log-prob
    lp = logp_after(())
    top = lp.topk(K)
    level = [((int(t),), float(s)) for s, t in zip(top.values, top.indices)]
    nodes.update(level)
    for _ in range(1, D):
        children = []
        for path, score in level:
            lp = logp_after(path)
            top = lp.topk(K)
            children += [(path + (int(t),), score + float(s)) for s, t in zip(top.values, top.indices)]
        nodes.update(children)
        level = sorted(children, key=lambda x: -x[1])[:K]
    chosen = set()
    for path, _ in sorted(nodes.items(), key=lambda x: -x[1]):
        if len(chosen) >= N:
            break
        if len(path) == 1 or path[:-1] in chosen:
            chosen.add(path)
    to_target = lambda p: tuple(int(x) for x in d.head.to_target_ids(torch.tensor(p)))   # noqa: E731
    return {to_target(p) for p in chosen}


@pytest.mark.parametrize("K,D,N,budget", [(3, 4, 12, 20), (2, 5, 9, 20), (4, 3, 30, 10), (1, 4, 8, 20)])
def test_tree_is_eagle2s_best_n_tree(target, head, K, D, N, budget):
    """The tree drafter (batched, tree-masked head passes) builds exactly EAGLE-2's tree computed the slow way;
    every node's parent is in the tree; it fills min(N, budget) nodes; with top_k 1 it is the chain draft."""
    ids = random_prompt(7, 12)
    draft = _head_ready(target, head, ids, TreeConfig(top_k=K, depth=D, total_tokens=N)).propose(
        DraftRequest(tokens=ids, max_len=D, budget=budget))
    nodes = {tuple(c[:i + 1]) for c in draft.candidates for i in range(len(c))}
    want = eagle2_reference(_head_ready(target, head, ids, TreeConfig(K, D, N)), K, D, min(N, budget))
    assert nodes == want
    assert all(len(p) == 1 or p[:-1] in nodes for p in nodes)              # parents before children
    assert len(nodes) == min(N, budget, K + (D - 1) * K * K)               # expanded: K, then K x K per level
    if K == 1:
        chain = Eagle3Drafter(head, target, chain=True, gamma=D)
        chain.reset(ids)
        with torch.no_grad():
            hs = target(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True).hidden_states
        chain.add_features({(i - 1, "mlp"): hs[i][0] for i in chain.layers})
        assert draft.candidates == chain.propose(DraftRequest(tokens=ids, max_len=D, budget=budget)).candidates


class BranchOracle:
    """Drafts a wrong first candidate and the true continuation second: the accepted path is a tree branch
    (non-contiguous verify rows), so the cache and the head's features must be gathered, not sliced."""
    name, path = "branch-oracle", "copy"

    def __init__(self, full):
        self.full = list(full)

    def reset(self, tokens):
        pass

    def extend(self, tokens, n_new):
        pass

    def propose(self, req):
        from switchsd.core.drafting import Draft
        n = len(req.tokens)
        truth = self.full[n:n + min(4, req.max_len)]
        if not truth:
            return Draft([])
        return Draft([[(truth[0] + 1) % V] + truth[1:], truth])


class EveryOther:
    def __init__(self, branch, eagle):
        self.branch, self.eagle, self.drafters = branch, eagle, [branch, eagle]

    def select(self, state: PolicyState):
        return Decision((self.branch,) if state.step % 2 == 0 else (self.eagle,))

    def observe(self, event):
        pass


def test_lazy_propagation_after_branch_accepts(target, head):
    """Branch accepts (the second candidate of a trie) alternate with EAGLE-3 steps: the head's incremental state
    equals a head fed by hand with (target feature at t, token t+1) for every cached position; feeding the
    features of the first rows instead of the accepted branch's rows would break it."""
    ids = repetitive_prompt(6, n=12, reps=2)
    want = greedy_reference(target, ids, 30, eos=None)
    eagle = Eagle3Drafter(head, target, chain=True, gamma=3, catch_up=None)   # every position fed
    cfg = EngineConfig(max_new_tokens=30, budget=12, stop_at_eos=False)
    events = list(make_engine(target, EveryOther(BranchOracle(ids + want), eagle), cfg, ()).generate(ids))
    assert [t for e in events for t in e.new_tokens] == want
    branch = [e for e in events if e.path == "copy" and e.accepted_candidate == 1 and len(e.accepted) >= 2]
    assert branch and all(e.accepted_rows != list(range(1, len(e.accepted_rows) + 1)) for e in branch)
    tokens = list(eagle.tokens)
    incremental = eagle._catch_up()
    # by hand: features of the full committed sequence, paired with the next token, one forward of the head
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
    g = torch.cat([hs[i][0] for i in eagle.layers], -1)                       # [T-1, 3H]: g_t
    nxt = torch.tensor(tokens[1:])                                             # x_{t+1}
    out, k, _ = head.step(eagle._embed(nxt)[None], head.fc(g)[None], torch.arange(len(tokens) - 1), None, None, None)
    torch.testing.assert_close(incremental, out[0, -1], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(eagle.k, k, rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module")
def trained_head(tmp_path_factory, target):
    """The random head after a few hundred steps of EAGLE-3's training (TTT, `switchsd.training.eagle3`) on the
    tiny target's own greedy continuations: a neural drafter that agrees with the target often, so exactness
    tests check accepted drafts, not only rejected ones."""
    from switchsd.training.eagle3 import ttt_loss
    folder = tmp_path_factory.mktemp("trained-head")
    write_head(folder)
    head = load_eagle3(str(folder), target)
    layers = head.config.layers_for(target.config.num_hidden_layers)
    samples = []
    for seed in range(24):
        ids = random_prompt(300 + seed, 6 + seed % 5)
        full = ids + greedy_reference(target, ids, 24, eos=None)
        with torch.no_grad():
            hs = target(input_ids=torch.tensor([full]), output_hidden_states=True).hidden_states
        samples.append({"ids": torch.tensor(full), "aux": torch.cat([hs[i][0, :-1] for i in layers], -1),
                        "final": hs[-1][0, :-1], "start": len(ids)})
    teacher_w = target.lm_head.weight[head.to_target_ids(torch.arange(head.config.draft_vocab_size))].detach().float()
    embed = torch.nn.Embedding.from_pretrained(target.get_input_embeddings().weight.detach().float())
    head = head.float().requires_grad_(True)                # the trainer works in float32
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for step in range(600):
        batch = [samples[(step * 4 + j) % len(samples)] for j in range(4)]
        loss, _, _ = ttt_loss(head, embed, teacher_w, batch, K=3)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.double().requires_grad_(False).eval()


@pytest.mark.parametrize("chain", [True, False])
def test_trained_head_greedy_equals_vanilla_with_accepted_drafts(target, trained_head, chain):
    accepted = drafted = branch = 0
    for seed in range(6):                                  # prompts the head was trained on: it agrees there
        ids = random_prompt(300 + seed, 6 + seed % 5)
        res = eagle_engine(target, trained_head, chain, max_new=30).run(ids)
        assert res.token_ids == greedy_reference(target, ids, 30, eos=None)
        accepted += sum(len(e.accepted) for e in res.events)
        drafted += sum(len(e.tree_tokens) - 1 for e in res.events)
        branch += sum(e.accepted_candidate not in (None, 0) for e in res.events)
    assert 0.2 * 30 * 6 <= accepted < drafted, (accepted, drafted)   # >= 20% of the tokens are accepted drafts
    if not chain:
        assert branch > 0                                             # a non-first candidate (a branch) accepted


def _two_token_law_check(target, prompt, sampling, runs: int, policy) -> list:
    """Run `runs` two-token generations (run i: `policy(i)`, verifier seed i) and check the first token and the
    first pair follow the target's filtered law (chi-square), and that the first token is rejected as the
    unfiltered T = 1 law (negative control). Returns each run's first StepEvent."""
    from collections import Counter

    from helpers import chisq_pvalue

    from switchsd.core.verify import target_probs
    first, pairs, events = Counter(), Counter(), []
    for i in range(runs):
        eng = make_engine(target, policy(i), EngineConfig(max_new_tokens=2, budget=8, sampling=sampling,
                                                     stop_at_eos=False), ())
        gen = eng.run(prompt, generator=torch.Generator().manual_seed(i))
        events.append(gen.events[0])
        first[(gen.token_ids[0],)] += 1
        pairs[tuple(gen.token_ids[:2])] += 1
    with torch.no_grad():
        l1 = target(input_ids=torch.tensor([prompt])).logits[0, -1]
        l2 = target(input_ids=torch.tensor([prompt + [x] for x in range(V)])).logits[:, -1]
    p1, p2 = target_probs(l1, sampling).double(), target_probs(l2, sampling).double()
    assert chisq_pvalue(first, {(x,): float(p1[x]) for x in range(V)}) > 1e-3
    assert chisq_pvalue(pairs, {(a, b): float(p1[a] * p2[a, b]) for a in range(V) for b in range(V)}) > 1e-3
    q1 = torch.softmax(l1.double(), -1)
    assert chisq_pvalue(first, {(x,): float(q1[x]) for x in range(V)}) < 1e-6
    return events


@pytest.mark.slow
@pytest.mark.parametrize("chain,temperature,top_k,top_p", [(True, 0.7, 8, 1.0), (True, 1.3, 0, 0.9),
                                                           (False, 1.3, 10, 1.0), (False, 0.7, 6, 0.95)])
def test_trained_head_sampling_follows_the_filtered_target(target, trained_head, chain, temperature, top_k, top_p):
    """Sampled EAGLE-3 chains (q over the target vocabulary through d2t) and trees (point masses) at T 0.7 / 1.3
    with top-k / top-p: the first two tokens follow the filtered target law; drafts are accepted often; the
    unfiltered T = 1 law is rejected (negative control)."""
    from switchsd.core.config import SamplingConfig
    sampling = SamplingConfig(temperature, top_k, top_p)
    prompt = random_prompt(301, 7)
    runs = 1500

    def policy(i):
        drafter = Eagle3Drafter(trained_head, target, TreeConfig(3, 2, 6), chain=chain, gamma=2, sampling=sampling,
                                generator=torch.Generator().manual_seed(i + 1_000_003))
        return build_policy("eagle3", (), CopyConfig(), drafter, neural_cfg=NeuralConfig(
            shape="chain" if chain else "tree"))

    first_steps = _two_token_law_check(target, prompt, sampling, runs, policy)
    accepted = sum(len(e.accepted) > 0 for e in first_steps)
    assert accepted > 0.04 * runs, f"setup: drafts must be accepted ({accepted}/{runs})"


@pytest.mark.parametrize("temperature,top_k", [(0.15, 0), (0.2, 6)])
def test_sampled_chain_draws_from_the_q_it_reports(target, trained_head, temperature, top_k):
    """The first token of a sampled chain follows the q the drafter hands to verification (chi-square), and is
    rejected as a sharper law (negative control): verification is only lossless if the two agree."""
    from collections import Counter

    from helpers import chisq_pvalue

    from switchsd.core.config import SamplingConfig
    d = _head_ready(target, trained_head, random_prompt(301, 7), TreeConfig())
    d.chain, d.gamma = True, 1
    d.sampling = SamplingConfig(temperature, top_k)
    d.generator = torch.Generator().manual_seed(0)
    req = DraftRequest(tokens=d.tokens, max_len=1, budget=4)
    counts, q = Counter(), None
    for _ in range(3000):
        draft = d.propose(req)                          # no commit in between: the same state, the same q
        counts[(draft.candidates[0][0],)] += 1
        q = draft.q[0][0].double()
    assert chisq_pvalue(counts, {(x,): float(q[x]) for x in range(V)}) > 1e-3
    sharp = q * q / (q * q).sum()
    assert chisq_pvalue(counts, {(x,): float(sharp[x]) for x in range(V)}) < 1e-6


def test_regrown_head_keeps_weights_and_shared_lm_head_rows(tmp_path, target, head):
    """A new draft vocabulary grown from a trained head: the decoder layer, fc and norm are the old head's; the
    lm_head row of every token both vocabularies hold is the old row, so those logits are unchanged."""
    from switchsd.drafters.eagle3_model import Eagle3Config
    from switchsd.training.eagle3 import build_vocab, regrown
    folder = tmp_path / "h"
    write_head(folder)
    old = load_eagle3(str(folder), target).float()
    n_old = int(old.t2d.sum())
    samples = [{"ids": torch.arange(V).repeat(2), "start": 0}]
    extra = torch.zeros(V, dtype=torch.long)
    extra[:n_old + 4] = 100                                      # the new vocabulary: target ids 0 .. n_old + 3
    d2t, t2d, cov = build_vocab(samples, n_old + 4, V, extra)
    assert t2d[:n_old + 4].all() and not t2d[n_old + 4:].any() and cov == pytest.approx((n_old + 4) / V)
    cfg = Eagle3Config(**{**old.config.__dict__, "draft_vocab_size": n_old + 4})
    new = regrown(str(folder), target, cfg, d2t, t2d)
    assert torch.equal(new.fc.weight, old.fc.weight)
    assert torch.equal(new.midlayer.mlp.down_proj.weight, old.midlayer.mlp.down_proj.weight)
    old_ids, new_ids = torch.nonzero(old.t2d).flatten().tolist(), torch.nonzero(new.t2d).flatten().tolist()
    for tok in set(old_ids) & set(new_ids):
        assert torch.equal(new.lm_head.weight[new_ids.index(tok)], old.lm_head.weight[old_ids.index(tok)])
    assert len(set(new_ids) - set(old_ids)) > 0


def test_confident_chain_stops_when_told_and_propose_hands_it_over(target, trained_head, monkeypatch):
    """confident_chain drafts what the plain chain drafts, one token at a time, with each token's head probability
    (greedy: the top-1 softmax probability), stops when `keep` says so, and the step's propose returns a prefix of
    the held chain without drafting again; a commit drops it."""
    d = _head_ready(target, trained_head, random_prompt(301, 7), TreeConfig())
    d.chain, d.gamma = True, 4
    plain = d.propose(DraftRequest(tokens=d.tokens, max_len=4, budget=8)).candidates[0]
    seen = []
    draft, confs = d.confident_chain(DraftRequest(tokens=d.tokens, max_len=4, budget=8),
                                     lambda i, c: seen.append((i, c)) or i < 2)
    assert draft.candidates[0] == plain[:2] and len(confs) == 2 and [i for i, _ in seen] == [1, 2]
    logits = trained_head.logits(d.last_out)
    assert confs[0] == pytest.approx(float(torch.softmax(logits.float(), -1).max()), rel=1e-6)
    calls = []
    monkeypatch.setattr(d.head, "step", lambda *a, **k: calls.append(1))     # no head forward from here on
    assert d.propose(DraftRequest(tokens=d.tokens, max_len=1, budget=8)).candidates == [plain[:1]]
    assert d.propose(DraftRequest(tokens=d.tokens, max_len=4, budget=8)).candidates == [plain[:2]] and not calls
    d.extend(d.tokens, 0)
    assert d.held is None


@pytest.mark.parametrize("method", ["eagle3", "switchsd"])
def test_confidence_gate_greedy_equals_vanilla(target, trained_head, method):
    """The cost gate pricing each chain by its tokens' probabilities (GateConfig.confidence, variant +conf): output
    equals vanilla, chains are drafted and verified, and the calibration learns from the verified positions (the
    tiny head is under-confident: ~0.03 on its top token, so its bins learn that it lands more than that)."""
    from switchsd.core.config import GateConfig
    from switchsd.core.cost_gate import CostAware
    from switchsd.core.costs import VerifyCost
    cost = VerifyCost({1: 44.0, 2: 45.0, 4: 47.0, 8: 50.0})
    choices, updated, priced = {}, 0, 0
    for seed in range(6):
        ids = random_prompt(300 + seed, 6 + seed % 5) if seed % 2 == 0 else random_prompt(seed, 9)
        drafter = Eagle3Drafter(trained_head, target, chain=True, gamma=4)
        policy = build_policy(method, (), CopyConfig(kappa=3), drafter, tau=0.5, cost=cost,
                              gate=GateConfig(confidence=True, explore=0.05))    # re-try bursts within 30 steps
        assert isinstance(policy, CostAware) and policy.confidence
        eng = make_engine(target, policy, EngineConfig(max_new_tokens=30, budget=8, stop_at_eos=False), ())
        out = []
        for e in eng.generate(ids):
            out += e.new_tokens
            choices[e.gate["choice"]] = choices.get(e.gate["choice"], 0) + 1
            priced += bool(e.gate.get("neural_conf"))      # every step with room for a draft
        assert out == greedy_reference(target, ids, 30, eos=None), seed
        updated += sum(policy.calib.trials)
    assert choices.get("neural", 0) + choices.get("copy+neural", 0) > 0, choices
    assert updated > 0 and priced >= sum(choices.values()) - 6


class _StubChain:
    """A neural drafter whose chain tokens come with the given probabilities (for the gate's decisions alone)."""
    name, path, chain, gamma, tree = "stub", "neural", True, 4, None

    def __init__(self, confs):
        self.confs, self.kept = confs, 0

    def confident_chain(self, req, keep):
        out = []
        for i, c in enumerate(self.confs[:req.max_len]):
            out.append(c)
            if i + 1 == req.max_len or not keep(i + 1, c):
                break
        self.kept = len(out)
        return Draft([[7] * len(out)]), out


def test_confidence_gate_drafts_sure_chains_and_skips_unsure_ones():
    """On an fp32-like curve (a draft row costs ~half a plain step): a chain the head is sure of is verified whole;
    one it doubts runs a plain step, and drafting stopped after its first token."""
    from switchsd.core.cost_gate import CostAware
    from switchsd.core.costs import VerifyCost
    cost = VerifyCost({1: 44.0, 2: 73.0, 4: 68.0, 8: 65.0})
    sure, unsure = _StubChain([0.97, 0.95, 0.93, 0.9]), _StubChain([0.02, 0.9, 0.9, 0.9])
    for stub, choice, depth in ((sure, "neural", 4), (unsure, "plain", 1)):
        gate = CostAware(None, stub, None, cost, confidence=True)
        decision = gate.select(PolicyState([1, 2, 3], 1, None, 10, 16))
        drafters, info = decision.drafters, decision.why
        assert info["choice"] == choice and stub.kept == depth, info
        assert info["neural_conf"] == stub.confs[:depth]
        if choice == "neural":
            assert drafters == (stub,) and info["neural_depth"] == 4 and decision.max_len == 4


@pytest.mark.slow
def test_confidence_gate_sampling_follows_the_target(target, trained_head):
    """Sampled chains drafted by the confidence gate (the chain is sampled once, in select, and handed to verify):
    the first two tokens follow the target's law at T = 0.7, top-k 8; drafts are accepted; the unfiltered T = 1 law
    is rejected (negative control)."""
    from switchsd.core.config import SamplingConfig
    from switchsd.core.cost_gate import CostAware
    from switchsd.core.costs import VerifyCost
    sampling = SamplingConfig(0.7, 8)
    prompt = random_prompt(301, 7)
    runs = 1000

    def policy(i):
        drafter = Eagle3Drafter(trained_head, target, chain=True, gamma=2, sampling=sampling,
                                generator=torch.Generator().manual_seed(i + 2_000_003))
        return CostAware(None, drafter, None, VerifyCost({1: 10.0, 2: 10.2, 4: 10.5}), confidence=True)

    first_steps = _two_token_law_check(target, prompt, sampling, runs, policy)
    drafted = sum(e.path == "neural" for e in first_steps)
    accepted = sum(len(e.accepted) > 0 for e in first_steps)
    assert drafted > 0.5 * runs and accepted > 0.04 * runs, (drafted, accepted)


def test_wide_forwards_through_a_float32_copy_stay_lossless(target, trained_head, monkeypatch):
    """Where 16-bit arithmetic is emulated the head's catch-ups and tree levels run a float32 copy
    (`wide_head`). Forced here on the float64 head: the copy is used, made once, and outputs equal vanilla."""
    import switchsd.drafters.eagle3 as e3
    monkeypatch.setattr(e3, "attention_dtype", lambda dtype, device: torch.float32 if dtype != torch.float32 else dtype)
    monkeypatch.setattr(e3, "WIDE_ROWS", 2)      # the tiny runs' catch-ups and tree levels are a few rows wide
    calls = []
    wide = e3.wide_head(trained_head)
    assert wide is not None and wide is e3.wide_head(trained_head) and wide.fc.weight.dtype == torch.float32
    monkeypatch.setattr(wide, "step", lambda *a, **k: calls.append(a[0].shape[1]) or type(wide).step(wide, *a, **k))
    for chain in (True, False):
        for seed in range(3):
            ids = random_prompt(300 + seed, 6 + seed % 5)
            res = eagle_engine(target, trained_head, chain, max_new=30).run(ids)
            assert res.token_ids == greedy_reference(target, ids, 30, eos=None)
    assert calls and min(calls) >= e3.WIDE_ROWS
    del e3._WIDE[trained_head]


def test_the_q8_head_drafts_close_to_the_head_and_stays_lossless(target, trained_head):
    """On a CPU a 16-bit or float32 head drafts through its Q8_0 copy (C kernels): its draft law stays near the
    head's own, the copy is made once per head, and a float32 target decoded with it still equals vanilla."""
    import copy

    from switchsd.drafters.eagle3 import q8_head
    head32 = copy.deepcopy(trained_head).float()
    fast = q8_head(head32)
    assert fast is not None and fast is q8_head(head32) and q8_head(trained_head) is None   # float64: kept
    out = torch.randn(5, H, generator=torch.Generator().manual_seed(0))
    p, q = torch.softmax(head32.logits(out), -1), torch.softmax(fast.logits(out), -1)
    assert 0 < (p - q).abs().sum(-1).max() < 0.1
    target32 = copy.deepcopy(target).float()
    drafter = Eagle3Drafter(head32, target32, chain=True, gamma=4)
    assert drafter.head is fast
    policy = build_policy("eagle3", (), CopyConfig(), drafter, neural_cfg=NeuralConfig(shape="chain"))
    accepted = 0
    for seed in range(6):
        ids = repetitive_prompt(seed) if seed % 2 else random_prompt(300 + seed, 6 + seed % 5)
        res = make_engine(target32, policy, EngineConfig(max_new_tokens=30, stop_at_eos=False), ()).run(ids)
        assert res.token_ids == greedy_reference(target32, ids, 30, eos=None)
        accepted += sum(len(e.accepted) for e in res.events if e.path == "neural")
    assert accepted >= 10, accepted


def test_the_q8_head_s_layer_in_c_is_its_torch_layer(trained_head):
    """The Q8 head's decoder layer runs as one C call (switchsd/kernels/eagle3.c): it computes what the same Q8_0
    matrices give through torch, to float32 rounding, at a catch-up over several rows, at a one-row step over the
    cache, and at a tree level under a mask; and a level's rows equal one-row calls bit for bit."""
    import copy

    from switchsd.drafters.eagle3_model import Eagle3Head
    from switchsd.drafters.eagle3_q8 import Q8Eagle3Head, q8_head
    fast = q8_head(copy.deepcopy(trained_head).float())
    assert isinstance(fast, Q8Eagle3Head)
    g = torch.Generator().manual_seed(1)
    S, n = 12, 3
    emb, h = torch.randn(1, S, H, generator=g), torch.randn(1, S, H, generator=g)
    pos = torch.arange(S)
    close = lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))
    ref, got = Eagle3Head.step(fast, emb, h, pos, None, None, None), fast.step(emb, h, pos, None, None, None)
    assert all(close(a, b) for a, b in zip(got, ref))
    k, v = got[1], got[2]
    e1, h1 = torch.randn(1, n, H, generator=g), torch.randn(1, n, H, generator=g)
    one = [fast.step(e1[:, i:i + 1], h1[:, i:i + 1], torch.tensor([S]), k, v, None) for i in range(n)]
    ref1 = Eagle3Head.step(fast, e1[:, :1], h1[:, :1], torch.tensor([S]), k, v, None)
    assert all(close(a, b) for a, b in zip(one[0], ref1))
    mask = torch.cat([torch.ones(n, S, dtype=torch.bool), torch.eye(n, dtype=torch.bool)], 1)   # each sees itself
    level = fast.step(e1, h1, torch.full((n,), S), k, v, mask)
    assert close(level[0], Eagle3Head.step(fast, e1, h1, torch.full((n,), S), k, v, mask)[0])
    assert torch.equal(level[0][0], torch.cat([o[0][0] for o in one]))
    assert torch.equal(fast.logits(level[0][0]), torch.cat([fast.logits(o[0][0]) for o in one]))
    assert close(fast.logits(level[0][0]), Eagle3Head.logits(fast, level[0][0]))


def test_the_q8_head_drafts_in_place_what_the_copying_path_drafts(target, trained_head):
    """The Q8 head's catch-ups and greedy chains write their K/V into a cache with room (`HeadCache`) instead of
    copying the past each step: the same chains and confidences, catch-up by catch-up, as the copying path, the
    stable entries the same K/V, and a grown cache keeps them."""
    import copy

    from switchsd.drafters.eagle3_q8 import HeadCache
    target32 = copy.deepcopy(target).float()
    fast, slow = (Eagle3Drafter(copy.deepcopy(trained_head).float(), target32, chain=True, gamma=4) for _ in range(2))
    ids = random_prompt(7, 320)
    feats = target32(torch.tensor([ids]), output_hidden_states=True).hidden_states
    for d in (fast, slow):
        d.reset(ids[:1])
    slow.kv = None                                                       # the copying path
    assert isinstance(fast.kv, HeadCache)
    keep = lambda i, c: True                                             # noqa: E731  (whole chains)
    for end in (250, 251, 253, 280, 300, 310):        # catch-ups of 128 (the window), 1, 2, 27, 20 and 10 rows
        for d in (fast, slow):
            d.extend(ids[:end + 1], 0)
            start = d.paired
            d.add_features({s: feats[s[0] + 1][0, start:end] for s in d.sites})
        a, b = (d.confident_chain(DraftRequest(tokens=ids[:end + 1], max_len=4, budget=8), keep) for d in (fast, slow))
        assert a[0].candidates == b[0].candidates and len(a[0].candidates[0]) == 4 and a[1] == b[1]
        assert torch.equal(fast.k, slow.k) and torch.equal(fast.v, slow.v)
    fast.kv.room(300)                                                    # grown: the entries kept, the views too
    assert fast.kv.cap >= 300 and torch.equal(fast.kv.views(fast.cached)[0], slow.k)
