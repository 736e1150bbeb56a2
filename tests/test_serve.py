"""The batched engine (switchsd/serve): many requests in one target forward, each decoded exactly as alone.

Tiny float64 models: ragged prompt lengths, more requests than slots (rows join as others finish), early EOS,
trees (copy candidates, EAGLE-3 trees) padded beside one-row steps; greedy outputs equal single-request
greedy decoding, and sampled outputs equal the single engine's under the same per-request generator.
"""
from __future__ import annotations

import pytest
import torch
from helpers import EOS, greedy_reference, random_prompt, repetitive_prompt

from switchsd.core.config import CopyConfig, EngineConfig, NeuralConfig, SamplingConfig
from switchsd.core.drafting import DraftRequest
from switchsd.core.engine import Engine
from switchsd.core.policies import Fixed
from switchsd.drafters.eagle3 import Eagle3Drafter, TreeConfig
from switchsd.drafters.oracle import OracleDrafter
from switchsd.factory import make_engine
from switchsd.methods import build_policy
from switchsd.models.lean import LeanLlama
from switchsd.serve.batched import BatchedKV, batch_inputs, batched_forward
from switchsd.serve.drafting import BatchDrafter
from switchsd.serve.engine import BatchedEngine, tokens_of


def prompts(n: int = 7) -> dict[int, list[int]]:
    """Ragged lengths; odd ones repeat themselves (the copy drafter accepts there)."""
    return {i: repetitive_prompt(i, n=8 + 3 * i, reps=2) if i % 2 else random_prompt(i, 5 + 4 * i) for i in range(n)}


def engine_for(model, method: str, cfg: EngineConfig, neural=None, eos=(EOS,)) -> Engine:
    return make_engine(model, build_policy(method, eos, CopyConfig(kappa=2), neural,
                                      neural_cfg=NeuralConfig(shape="tree")), cfg, eos)


@pytest.mark.parametrize("method", ["vanilla", "copy", "pld", "copyspec"])
@pytest.mark.parametrize("max_batch", [1, 3, 8])
def test_batched_greedy_equals_single_request(tiny_model, method, max_batch):
    cfg = EngineConfig(max_new_tokens=30, budget=12)
    ps = prompts()
    be = BatchedEngine(tiny_model, lambda: engine_for(tiny_model, method, cfg).decoder, cfg, max_batch=max_batch)
    got = {i: tokens_of(e) for i, e in be.run_all(ps).items()}
    for i, ids in ps.items():
        assert got[i] == greedy_reference(tiny_model, ids, 30), (method, i)
    assert max(be.batch_sizes) == min(max_batch, len(ps))
    if 1 < max_batch < len(ps):                    # rows left and others joined
        assert len(set(be.batch_sizes)) > 1
    if method != "vanilla":                        # drafts were accepted inside the batch
        assert sum(len(e.accepted) for es in be.run_all(ps).values() for e in es) > 0


@pytest.mark.parametrize("method", ["vanilla", "copy", "copyspec"])
def test_staggered_arrivals_equal_single_requests(tiny_model, method):
    """Requests arrive between steps (at steps 0, 0, 3, 4, 9, 10, 18), join rows that are mid-decode, and leave
    as they finish; every output equals single-request greedy decoding, and rows really did join a running batch
    (a slot refilled after compaction, a row admitted while others were drafting)."""
    cfg = EngineConfig(max_new_tokens=24, budget=12)
    ps = prompts(7)
    arrive = dict(zip(sorted(ps), (0, 0, 3, 4, 9, 10, 18)))
    be = BatchedEngine(tiny_model, lambda: engine_for(tiny_model, method, cfg).decoder, cfg, max_batch=3)
    events: dict = {i: [] for i in ps}
    joined_running = 0
    step = 0
    while step < 400 and (any(not events[i] or not events[i][-1].finished for i in ps)):
        for i in ps:
            if arrive[i] == step:
                joined_running += be.active > 0
                be.submit(i, ps[i])
        for rid, e in be.step():
            events[rid].append(e)
        step += 1
    for i, ids in ps.items():
        assert tokens_of(events[i]) == greedy_reference(tiny_model, ids, 24), (method, i)
    assert joined_running >= 4 and len(set(be.batch_sizes)) > 1, (joined_running, be.batch_sizes)


def test_batched_oracle_trees_and_early_eos(tiny_model):
    """An oracle drafter (the true continuation, every token accepted) beside plain rows: multi-token commits
    and different tree widths in one forward; EOS ends rows early."""
    cfg = EngineConfig(max_new_tokens=40, budget=9)
    ps = prompts(5)
    refs = {i: greedy_reference(tiny_model, ids, 40) for i, ids in ps.items()}
    it = iter(sorted(ps))
    def make():
        i = next(it)
        drafters = [OracleDrafter(ps[i] + refs[i])] if i % 2 == 0 else []
        return make_engine(tiny_model, Fixed(drafters), cfg, (EOS,)).decoder
    be = BatchedEngine(tiny_model, make, cfg, max_batch=5)
    evs = be.run_all(ps)
    for i in ps:
        assert tokens_of(evs[i]) == refs[i]
        if i % 2 == 0:                             # budget 9: up to 8 drafted tokens accepted per step
            assert len(evs[i]) <= 1 + len(refs[i]) // 4, (len(evs[i]), len(refs[i]))
    assert any(evs[i][-1].finished == "eos" for i in ps) or all(len(refs[i]) == 40 for i in ps)


def test_batched_eagle3_trees(tiny_model):
    import tempfile
    from pathlib import Path

    from test_eagle3 import write_head
    from transformers import LlamaConfig, LlamaForCausalLM

    from switchsd.drafters.eagle3_model import load_eagle3
    torch.manual_seed(3)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=6, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                                          eos_token_id=1)).to(torch.float64).eval().requires_grad_(False)
    with tempfile.TemporaryDirectory() as d:
        write_head(Path(d))
        head = load_eagle3(d, target)
    cfg = EngineConfig(max_new_tokens=24, budget=16, stop_at_eos=False)
    make_single = lambda: engine_for(target, "eagle3", cfg, Eagle3Drafter(head, target, TreeConfig(3, 3, 8)), eos=())  # noqa: E731
    make = lambda: make_single().decoder  # noqa: E731
    probe = make()
    be = BatchedEngine(target, make, cfg, max_batch=4, sites=probe.feature_drafters[0].sites)
    ps = prompts(6)
    evs = be.run_all(ps)
    for i, ids in ps.items():
        assert tokens_of(evs[i]) == greedy_reference(target, ids, 24, eos=None)
        # the state check: each row's head was fed its own row's features, so it drafts the very trees a
        # single-request engine drafts (a feed from another row, or a missed one, changes them; the outputs
        # alone would not show it, verification being lossless)
        single = make_single().run(ids).events
        assert [(e.tree_tokens, e.tree_parents) for e in evs[i]] == [(e.tree_tokens, e.tree_parents) for e in single]
    assert any(len(e.tree_tokens) > 2 for es in evs.values() for e in es)


def test_batched_sampling_follows_each_requests_generator(peaked_model):
    cfg = EngineConfig(max_new_tokens=20, budget=8, sampling=SamplingConfig(0.9))
    ps = prompts(4)
    single = {i: engine_for(peaked_model, "copy", cfg).run(ids, torch.Generator().manual_seed(i)).token_ids
              for i, ids in ps.items()}
    be = BatchedEngine(peaked_model, lambda: engine_for(peaked_model, "copy", cfg).decoder, cfg, max_batch=3)
    got = be.run_all(ps, {i: torch.Generator().manual_seed(i) for i in ps})
    assert {i: tokens_of(e) for i, e in got.items()} == single


def test_batched_kv_keep_and_move(tiny_model):
    """keep() gathers a branch into place; move() carries a row to another slot; the next forward from the moved
    row equals the single-request lean forward on a StaticKVCache rolled back the same way."""
    lean = LeanLlama.of(tiny_model)
    cache = BatchedKV(lean, 3, 4)
    toks = random_prompt(1, 9)
    ids = torch.tensor(toks)[None]
    batched_forward(lean, ids, cache, torch.arange(9)[None], None, first_slot=2)
    before = cache.k[:, 2, :, :9].clone()
    cache.keep(2, 5, [0, 2, 3])                     # positions 0..4, then 5, 7, 8
    idx = torch.tensor([0, 1, 2, 3, 4, 5, 7, 8])
    assert cache.lens[2] == 8 and torch.equal(cache.k[:, 2, :, :8], before[:, :, idx])
    cache.move(2, 0)
    assert cache.lens[0] == 8 and torch.equal(cache.k[:, 0, :, :8], before[:, :, idx])
    from switchsd.core.tree import build_tree
    i2, p2, m2 = batch_inputs([build_tree(3, [], 1)], [8], lean.dtype, "cpu")
    got, _ = batched_forward(lean, i2, cache, p2, m2, rows=[1])
    ref = lean.new_cache(16)
    lean.forward(ids, ref)
    ref.keep(5, [0, 2, 3])
    want, _ = lean.forward(torch.tensor([[3]]), ref, torch.tensor([[8]]))
    assert torch.allclose(got, want, atol=1e-12)
    cache.lens[:2] = [3, 4]
    with pytest.raises(ValueError, match="equal length"):
        batched_forward(lean, torch.zeros(2, 2, dtype=torch.long), cache, torch.zeros(2, 2, dtype=torch.long), None)


@pytest.mark.real
def test_batched_real_model_equals_single_requests(real_lm):
    """SmolLM2 in float32: vanilla, copy and SwitchSD (per-row gate, EAGLE-3 head) batched equal vanilla."""
    from switchsd.factory import Drafters, build_engine
    d = Drafters(real_lm)
    texts = ["Write a Python function that reverses a list.", "What is 2+2?",
             "Repeat: the quick brown fox jumps over the lazy dog. The quick brown fox", "List three colors.",
             "def fib(n):\n    if n < 2:\n        return n\n    return"]
    ps = {i: real_lm.encode(t, chat=True) for i, t in enumerate(texts)}
    cfg = EngineConfig(max_new_tokens=24)
    van = {i: build_engine("vanilla", real_lm, d, cfg).run(ids).token_ids for i, ids in ps.items()}
    for method in ("vanilla", "copy", "switchsd"):
        sites = build_engine(method, real_lm, d, cfg).sites
        be = BatchedEngine(real_lm.model, lambda: build_engine(method, real_lm, d, cfg).decoder, cfg, max_batch=3,
                           sites=sites)
        got = {i: tokens_of(e) for i, e in be.run_all(ps).items()}
        assert got == van, method


class InlineDrafter:
    """DrafterProcess's interface over in-process BatchDrafters (the schedule without a second process)."""

    def __init__(self, model, gamma):
        self.d = [BatchDrafter(model, gamma, 8), BatchDrafter(model, gamma, 8)]
        self.busy, self.calls, self.out = [], [], None

    def submit(self, sub, rows, n=None):
        self.calls.append((sub, sorted(rows)))
        self.out = self.d[sub].draft(rows, n)

    def collect(self):
        self.busy.append((0.0, 0.0))
        return self.out


def test_batch_drafter_equals_the_single_request_draft_model(tiny_model):
    """BatchDrafter's greedy chains (ragged rows, lazy sync, rows joining and leaving) equal DraftModelDrafter's."""
    from switchsd.core.smc import self_draft
    from switchsd.drafters.draft_model import DraftModelDrafter
    draft = self_draft(tiny_model, 1)
    bd = BatchDrafter(draft, 3, 4)
    ps = prompts(5)
    for step in range(3):
        rows = {i: ps[i] + [2 + step] * step for i in ps if (i + step) % 4}       # rows come and go
        got = bd.draft(rows)
        for i, toks in rows.items():
            ref = DraftModelDrafter(draft, 64, gamma=3)
            ref.reset(toks)
            assert got[i] == ref.propose(DraftRequest(tokens=toks, max_len=3, budget=8)).candidates[0], (step, i)


def test_psd_schedule_alternates_and_stays_exact(tiny_model):
    """MineDraft's schedule: two sub-batches alternate; the drafter drafts one while the other is verified;
    cold starts are drafted synchronously; outputs equal greedy decoding for every request."""
    from switchsd.core.smc import self_draft
    from switchsd.serve.load import Req, drain, external_decoder, run_batched, run_psd
    cfg = EngineConfig(max_new_tokens=20, budget=8)
    ps = prompts(6)
    inline = InlineDrafter(self_draft(tiny_model, 1), 3)
    reqs = [Req(i, ids, 0.0) for i, ids in ps.items()]
    trace = drain(run_psd(tiny_model, external_decoder(tiny_model, cfg, (EOS,)), cfg, reqs, 2, inline))
    for r in reqs:
        assert r.tokens == greedy_reference(tiny_model, r.ids, 20) and r.finish is not None
    subs = [s["sub"] for s in trace.spans if s["who"] == "target"]
    assert subs[:4] == [0, 1, 0, 1]                                 # the target alternates sub-batches
    assert inline.calls[0][0] == 0 and inline.calls[1][0] == 1     # cold start of 0, then 1 drafted during 0
    assert max(s["rows"] for s in trace.spans if s["who"] == "target") == 2
    reqs2 = [Req(i, ids, 0.0) for i, ids in ps.items()]
    drain(run_batched(tiny_model, external_decoder(tiny_model, cfg, (EOS,)), cfg, reqs2, 3,
                      drafter=BatchDrafter(self_draft(tiny_model, 1), 3, 3)))
    assert all(r.tokens == greedy_reference(tiny_model, r.ids, 20) for r in reqs2)


def test_arrivals():
    from switchsd.serve.load import arrivals
    assert arrivals(3, 0) == [0.0, 0.0, 0.0]
    a = arrivals(2000, 4.0, seed=1)
    assert a == sorted(a) and abs((a[-1] / 1999) - 0.25) < 0.02           # mean gap 1 / rate


@pytest.mark.real
def test_serve_bench_end_to_end(tmp_path, capsys):
    """The serving benchmark on the offline model (float32): batched SD and PSD with a real drafter process
    (vanilla and sps share their code paths and are covered on the tiny model above); every request identical
    to single-request greedy decoding; the last line is the JSON summary."""
    import json

    from switchsd.serve.bench import main
    main(["--modes", "sd,psd", "--requests", "3", "--max-batch", "2", "--max-new-tokens", "8",
          "--dtype", "float32", "--out", str(tmp_path)])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last["modes"]) == {"sd", "psd"}
    assert all(m["identical"] == m["n"] == 3 and m["throughput"] > 0 for m in last["modes"].values())
    res = json.loads((tmp_path / "results.json").read_text())
    assert any(s["who"] == "drafter" for s in res["traces"]["psd"])


def test_pearl_keeps_only_fully_accepted_optimistic_blocks(tiny_model):
    """PEARL: the optimistic next block is used only where every draft was accepted and the bonus guessed;
    outputs stay equal to greedy decoding."""
    from switchsd.core.smc import self_draft
    from switchsd.serve.load import Req, drain, external_decoder, run_pearl
    cfg = EngineConfig(max_new_tokens=20, budget=8)
    ps = prompts(4)
    inline = InlineDrafter(self_draft(tiny_model, 1), 3)
    reqs = [Req(i, ids, 0.0) for i, ids in ps.items()]
    drain(run_pearl(tiny_model, external_decoder(tiny_model, cfg, (EOS,)), cfg, reqs, 4, inline, 3))
    for r in reqs:
        assert r.tokens == greedy_reference(tiny_model, r.ids, 20)
    sizes = [len(rows) for _, rows in inline.calls]
    assert sizes[0] == 4 and any(n < 4 for n in sizes[2::2])     # cold start, then only the missed rows
