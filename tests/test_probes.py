"""Copy labels, decision alignment, probe fitting on a planted direction, probe file round trip and checks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import make_tiny_model

from probes.copydiversity import TIER_SHARE, build
from probes.fit import fit_probe
from probes.labels import ALIGN, aligned_pairs, copy_labels
from probes.metrics import best_f1, f1_at, roc_auc
from switchsd.core.probe import Probe, ProbeError, load_probe
from switchsd.io import read_jsonl


def spans(labels):
    return [i for i, v in enumerate(labels) if v]


@pytest.mark.parametrize("n_span,expect", [(4, False), (5, True), (6, True)])
def test_span_length_threshold(n_span, expect):
    src = list(range(10, 10 + n_span))
    toks = src + [99, 98] + src + [97]
    lab = copy_labels(toks, 5)
    start = n_span + 2
    assert all(lab[start + i] == expect for i in range(n_span))
    assert not any(lab[:start])          # first occurrences are not copies
    assert not lab[-1]


def test_prompt_repeat_vs_output_repeat():
    prompt = [1, 2, 3, 4, 5, 6, 50]
    out = [7, 8, 2, 3, 4, 5, 6, 9, 7, 8, 2, 3, 4, 40]   # copies 5 from the prompt, then 6 of its own output
    lab = copy_labels(prompt + out, 5)
    p = len(prompt)
    assert spans(lab[p:]) == [2, 3, 4, 5, 6, 8, 9, 10, 11, 12]


def test_overlapping_runs():
    toks = [5] * 9
    lab = copy_labels(toks, 5)
    assert spans(lab) == [1, 2, 3, 4, 5, 6, 7, 8]     # window at 1 occurred at 0 (overlap allowed)


def test_decision_alignment():
    """Feature position i is paired with the label of token i + 2: at decision time tokens[..i+1] are
    committed, i+1 is pending and unprocessed, h_i is the last hidden state; the drafter proposes i + 2."""
    assert ALIGN == 2
    toks = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5, 8]
    pos, lab = aligned_pairs(toks, start=6, n=5)
    assert pos == [j - 2 for j in range(6, 12)]
    assert lab == copy_labels(toks, 5)[6:12]
    assert lab == [True, True, True, True, True, False]


def test_copydiversity_tiers_and_split():
    rows = build(1000, seed=1)
    assert len({r["prompt"] for r in rows}) == 1000
    assert len({r["type"] for r in rows}) == 32          # 17 original types + 15 broadened families
    assert len({r["type"] for r in build(1000, seed=1, broad=False)}) == 17
    for tier, share in TIER_SHARE.items():
        assert abs(sum(r["tier"] == tier for r in rows) / 1000 - share) < 0.002
    assert sum(r["split"] == "val" for r in rows) == 200
    assert build(50, seed=3) == build(50, seed=3)


def test_realtext_prompts_carry_real_material():
    from probes import realtext
    m = realtext.material()
    assert min(len(v) for v in m.values()) > 100                  # stdlib code, docstrings, pydoc paragraphs
    rows = realtext.build(260, seed=1)
    assert len({r["prompt"] for r in rows}) == 260 and rows == realtext.build(260, seed=1)
    assert len({r["type"] for r in rows}) == 13
    for tier, share in realtext.TIER_SHARE.items():
        assert abs(sum(r["tier"] == tier for r in rows) / 260 - share) < 0.01
    copies = [r["prompt"] for r in rows if r["type"] == "rt_code_copy"]
    assert copies and all(any(src in p for src in m["code"]) for p in copies)   # the material is in the prompt
    import random
    text = m["prose"][0]
    typo = realtext._typos(random.Random(0), text, 3)
    assert typo != text and len(typo) == len(text)


def test_fit_recovers_planted_direction():
    g = torch.Generator().manual_seed(0)
    d, n = 32, 4000
    w_true = torch.randn(d, generator=g)
    x = torch.randn(n, d, generator=g) * torch.linspace(0.5, 50, d)   # badly scaled dims, like LLM states
    y = torch.rand(n, generator=g) < torch.sigmoid(x @ (w_true / torch.linspace(0.5, 50, d)) * 3)
    w = fit_probe(x, y, l2=1e-4)
    s = torch.sigmoid(x @ w)
    cos = torch.nn.functional.cosine_similarity(w * torch.linspace(0.5, 50, d), w_true, dim=0)
    assert cos > 0.95
    assert roc_auc(s, y) > 0.9
    # a shuffled-label control learns nothing
    w0 = fit_probe(x, y[torch.randperm(n, generator=g)], l2=1e-4)
    assert roc_auc(torch.sigmoid(x @ w0), y) < 0.6


def test_metrics_simple():
    s = torch.tensor([0.1, 0.4, 0.35, 0.8])
    y = torch.tensor([False, False, True, True])
    assert roc_auc(s, y) == pytest.approx(0.75)
    assert f1_at(s, y, 0.5) == pytest.approx(2 / 3)
    assert best_f1(s, y)[0] == pytest.approx(0.8)


def make_probe(model, layer=1, sub="attn"):
    d = model.config.hidden_size
    meta = {"model": "tiny", "hidden_size": d, "num_layers": model.config.num_hidden_layers, "n_train": 5,
            "kappa": 5, "align": 2, "data": {"x": 1}, "val_auc": 0.9, "val_f1": 0.7,
            "per_layer": [{"layer": 0, "sublayer": "attn", "auc": 0.8, "f1": 0.6, "tau": 0.4}]}
    return Probe(torch.randn(d), layer, sub, 0.4, meta)


def test_probe_round_trip(tmp_path, tiny_model):
    p = make_probe(tiny_model)
    p.save(tmp_path / "p.safetensors")
    q = load_probe(tmp_path / "p.safetensors", tiny_model)
    assert torch.equal(p.weight, q.weight) and q.site == (1, "attn") and q.tau == pytest.approx(0.4)
    assert q.meta["per_layer"][0]["auc"] == 0.8 and q.meta["data"] == {"x": 1}
    h = torch.randn(tiny_model.config.hidden_size, dtype=torch.float64)
    assert q.score(h) == pytest.approx(float(torch.sigmoid(h.float() @ p.weight)))


def test_probe_for_another_model_is_rejected(tmp_path, tiny_model):
    other = make_tiny_model(seed=0)
    p = make_probe(tiny_model)
    p.meta["hidden_size"] = 48
    p.weight = torch.randn(48)
    p.save(tmp_path / "p.safetensors")
    with pytest.raises(ProbeError, match="another model"):
        load_probe(tmp_path / "p.safetensors", other)
    p = make_probe(tiny_model)
    p.meta["num_layers"] = 7
    p.save(tmp_path / "q.safetensors")
    with pytest.raises(ProbeError, match="7-layer"):
        load_probe(tmp_path / "q.safetensors", other)


def test_bad_probe_files(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ProbeError, match="not a safetensors probe"):
        load_probe(tmp_path / "junk.safetensors")
    from safetensors.torch import save_file
    save_file({"weight": torch.zeros(4)}, str(tmp_path / "nometa.safetensors"))
    with pytest.raises(ProbeError, match="format"):
        load_probe(tmp_path / "nometa.safetensors")
    with pytest.raises(ProbeError, match="does not exist"):
        load_probe(tmp_path / "missing.safetensors")


def _with_meta(tmp_path, name, **meta):
    from safetensors.torch import save_file
    base = {"format": "switchsd-probe-v1", "layer": "1", "sublayer": "attn", "tau": "0.5"}
    save_file({"weight": torch.zeros(4)}, str(tmp_path / name), metadata={**base, **meta})
    return tmp_path / name


@pytest.mark.parametrize("meta,msg", [({"layer": "abc"}, "'layer' is not a number"),
                                      ({"per_layer": "[1]"}, "'per_layer' must be a list"),
                                      ({"tau": "NaN"}, "'tau' must be finite"),
                                      ({"tau": "1.5"}, "tau must be in"),
                                      ({"sublayer": "both"}, "sublayer must be")])
def test_malformed_probe_metadata_is_a_probe_error(tmp_path, meta, msg):
    with pytest.raises(ProbeError, match=msg):
        load_probe(_with_meta(tmp_path, "m.safetensors", **meta))


def test_probe_size_and_header_are_checked_before_any_weight_is_read(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from switchsd.core import probe as probe_mod
    big = tmp_path / "big.safetensors"
    big.write_bytes(b"\0" * (probe_mod.MAX_PROBE_BYTES + 1))
    save_file({"weight": torch.zeros(4), "extra": torch.zeros(2)}, str(tmp_path / "two.safetensors"))
    save_file({"weight": torch.zeros(2, 2)}, str(tmp_path / "matrix.safetensors"))
    huge_header = tmp_path / "hdr.safetensors"
    huge_header.write_bytes((10 ** 9).to_bytes(8, "little") + b"{}")
    reads = []
    monkeypatch.setattr("safetensors.safe_open", lambda *a, **k: reads.append(a) or (_ for _ in ()).throw(OSError()))
    for path, msg in [(big, "at most"), (tmp_path / "two.safetensors", "exactly one tensor"),
                      (tmp_path / "matrix.safetensors", "float vector"), (huge_header, "no valid header")]:
        with pytest.raises(ProbeError, match=msg):
            load_probe(path)
    assert reads == []          # refused on size / header alone


def test_engine_scores_captured_hidden_state(tiny_model):
    """The engine's probe score equals the probe applied to the hidden state of the last processed position,
    taken from a plain forward (no extra forward in the engine)."""
    from switchsd.core.config import EngineConfig
    from switchsd.factory import make_engine
    from switchsd.methods import build_policy
    from switchsd.models.capture import HiddenCapture
    probe = make_probe(tiny_model, layer=1, sub="attn")
    eng = make_engine(tiny_model, build_policy("copy"), EngineConfig(max_new_tokens=12, budget=8, stop_at_eos=False),
                 (), probe=probe)
    prompt = [5, 9, 11, 3, 7, 5, 9, 11, 3, 7, 5, 9]
    events = list(eng.generate(prompt))
    tokens = list(prompt)
    for e in events:
        with HiddenCapture(tiny_model, [probe.site]) as cap, torch.no_grad():
            tiny_model(input_ids=torch.tensor([tokens[:-1]]))
            want = probe.score(cap.last[probe.site][0, -1])
        assert e.probe_score == pytest.approx(want, abs=1e-9)
        tokens += e.new_tokens


STORED = Path(__file__).parent / "data" / "probe_completions.jsonl.gz"


def stored_sets() -> dict[str, tuple[list[dict], int]]:
    """The held-out prompt sets these tests score -> (rows, new tokens per completion)."""
    from probes import copydiversity
    from probes.evaluate import read_prompts
    sets = {"copydiversity_heldout_12345": (copydiversity.held_out(48, seed=12345), 128)}
    for name in ("probe_heldout.jsonl", "probe_heldout2.jsonl", "probe_heldout3.jsonl"):
        sets[name] = (read_prompts(str(Path(__file__).parent / "data" / name)), 64)
    return sets


def _shipped_probe_auc(lm, name: str, tmp_path) -> tuple[float, float]:
    """(ROC AUC, copy rate) of the shipped probe on greedy completions of set `name` written by the target.

    The completions (token ids) are stored in tests/data/probe_completions.jsonl.gz by
    `python tests/write_probe_completions.py`: writing them here was most of these tests' time (about half the
    suite's on an AVX2-only CPU). They are checked, not trusted: each prompt must encode to the stored prompt ids,
    and the scoring forwards must find >= 99% of completion tokens to be the target's argmax after their prefix
    (a batched product can break a rare near-tie otherwise); a missing row is generated afresh."""
    from probes.evaluate import score_sequences
    from probes.features import complete
    from switchsd.factory import DEFAULT_PROBES
    from switchsd.models.loading import DEFAULT_MODEL
    path = DEFAULT_PROBES[DEFAULT_MODEL]
    if not path.exists():
        pytest.skip("no shipped probe")
    probe = load_probe(str(path), lm.model)
    rows, max_new_tokens = stored_sets()[name]
    cache = tmp_path / "c.jsonl"
    stored = [r for r in read_jsonl(STORED) if r["set"] == name]
    prompt = {r["id"]: r["prompt"] for r in rows}
    for r in stored:
        assert r["prompt_ids"] == lm.encode(prompt[r["id"]], chat=True), f"{name} row {r['id']} is stale"
    cache.write_text("".join(json.dumps(r) + "\n" for r in stored))
    recs = complete(lm, rows, cache, max_new_tokens=max_new_tokens, batch=16)
    s, y, greedy = score_sequences(lm, probe, [(r["prompt_ids"] + r["completion_ids"], len(r["prompt_ids"]))
                                              for r in recs], int(probe.meta["n_train"]))
    assert greedy >= 0.99, f"only {greedy:.3f} of the stored completions' tokens are the target's greedy choice"
    rate = float(y.float().mean())
    assert 0.05 < rate < 0.95, "the held-out set must contain copy and non-copy positions"
    return roc_auc(s, y), rate


def test_stored_completions_cover_the_sets():
    """Every prompt of every scored set has a stored completion (else the real tests below generate it, slowly)."""
    have = {(r["set"], r["id"]) for r in read_jsonl(STORED)}
    for name, (rows, _) in stored_sets().items():
        assert {(name, r["id"]) for r in rows} <= have, name


@pytest.mark.real
def test_shipped_probe_on_held_out_copydiversity(real_lm, tmp_path):
    """48 fresh CopyDiversity prompts of all 32 types (another seed, none in the training set), decision-aligned
    labels, 128 new greedy tokens (to keep the suite under 10 minutes). Measured: AUC 0.938 at 128 tokens;
    0.948 at 192 (6815 positions; validation split 0.945): short answers hold fewer long-range repeats."""
    auc, _ = _shipped_probe_auc(real_lm, "copydiversity_heldout_12345", tmp_path)
    assert auc >= 0.93


@pytest.mark.real
@pytest.mark.parametrize("name", ["probe_heldout.jsonl", "probe_heldout2.jsonl", "probe_heldout3.jsonl"])
def test_shipped_probe_on_out_of_template_prompts(real_lm, tmp_path, name):
    """The shipped probe on prompts written by hand, not by CopyDiversity templates (the second set was written
    before the broadened probe was trained, the third, 48 prompts, before RealText's). Measured at 64 tokens:
    AUC 0.936, 0.946 and 0.962 (the 32-type CopyDiversity probe: 0.937, 0.944, 0.959; the 17-type one: 0.925 and
    0.931); at 192 tokens 0.940, 0.957 and 0.940. The misses are restatements of the question, copies in a
    changed format and late span edges (see probes/*.md)."""
    auc, _ = _shipped_probe_auc(real_lm, name, tmp_path)
    assert auc >= 0.93


def test_held_out_copydiversity_prompts_are_fresh(tmp_path):
    from probes import copydiversity
    rows = copydiversity.held_out(48, seed=12345)
    train = {r["prompt"] for r in copydiversity.build(1200, 0)}   # the shipped probe's training set
    assert len(rows) == 48 and not {r["prompt"] for r in rows} & train
    assert rows == copydiversity.held_out(48, seed=12345)
    assert {r["tier"] for r in rows} >= {"heavy", "light"}
    out = tmp_path / "h.jsonl"
    copydiversity.main(["--n", "10", "--seed", "7", "--out", str(out)])
    assert len(out.read_text().splitlines()) == 10


def test_retraining_keeps_the_cards_held_out_section(tmp_path):
    from probes.train import _keep_section
    md = tmp_path / "p.md"
    new = "# Card\n\n## Quality\n- x\n\n## Training-data ablation\n| a |\n\nReproduce: `x`\n"
    assert _keep_section(md, new, "## Held-out prompts", "## Training-data ablation") == new   # no old card
    md.write_text("# Old\n\n## Held-out prompts\n- AUC 0.96\n\n## Training-data ablation\n| old |\n")
    out = _keep_section(md, new, "## Held-out prompts", "## Training-data ablation")
    assert out == "# Card\n\n## Quality\n- x\n\n## Held-out prompts\n- AUC 0.96\n\n## Training-data ablation\n| a |\n\nReproduce: `x`\n"
