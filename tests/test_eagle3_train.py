"""EAGLE-3 training and inference share one block: the training-time-test forward (switchsd.training.eagle3)
equals `Eagle3Head.step` on the same inputs, step 0 over the whole sequence and step 1 as a drafted chain step;
the TTT loss trains; a new head's config comes from the target's."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig

from switchsd.drafters.eagle3_model import Eagle3Config, Eagle3Head, default_aux_layers
from switchsd.training.eagle3 import ttt_logits, ttt_loss

H, V, VD = 32, 64, 40


def tiny_head(seed: int = 0) -> tuple[Eagle3Head, torch.nn.Embedding]:
    torch.manual_seed(seed)
    cfg = Eagle3Config(hidden_size=H, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=V, draft_vocab_size=VD, target_hidden_size=H, rope_theta=500.0)
    head = Eagle3Head(cfg).double()
    for p in head.parameters():                       # away from the all-ones norms, so every weight matters
        p.data.add_(torch.randn_like(p) * 0.2)
    embed = torch.nn.Embedding(V, H).double()
    return head, embed


def test_ttt_step0_and_step1_equal_the_inference_block():
    head, embed = tiny_head()
    B, n = 2, 9
    ids = torch.randint(0, V, (B, n + 1))
    aux = torch.randn(B, n, 3 * H, dtype=torch.float64)
    with torch.no_grad():
        lp = ttt_logits(head, embed, ids, aux, K=2)
        h = head.fc(aux)
        pos = torch.arange(n)
        out0, k0, v0 = head.step(embed(ids[:, 1:n + 1]), h, pos, None, None, None)   # step 0: the sequence
        ref0 = torch.log_softmax(head.logits(out0).float(), -1)
        assert torch.allclose(lp[0], ref0, atol=1e-5, rtol=0)
        for t in (0, 4, n - 2):                       # step 1 at position t: one chained draft step
            out1, _, _ = head.step(embed(ids[:, t + 2:t + 3]), out0[:, t:t + 1], torch.tensor([t + 1]),
                                   k0[:, :, :t + 1], v0[:, :, :t + 1], None)
            ref1 = torch.log_softmax(head.logits(out1).float(), -1)[:, 0]
            assert torch.allclose(lp[1][:, t], ref1, atol=1e-5, rtol=0)


def test_ttt_loss_trains_the_head():
    head, embed = tiny_head(1)
    head = head.float()
    embed = embed.float().requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    batch = [{"ids": torch.randint(0, V, (12,), generator=g), "aux": torch.randn(11, 3 * H, generator=g),
              "final": torch.randn(11, H, generator=g), "start": 3} for _ in range(3)]
    teacher_w = torch.randn(VD, H, generator=g)
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        loss, accs, count = ttt_loss(head, embed, teacher_w, batch, K=3)
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    # step 0 predicts x_{t+2} from position t: t+2 a response token (>= start 3) and t+1 a feature position (< 11)
    assert len(accs) == 3 and count == 3 * len(range(1, 10))
    assert float(loss.detach()) < 0.9 * first


def test_new_head_config_follows_the_target():
    tc = LlamaConfig(vocab_size=V, hidden_size=H, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=64, rope_theta=12345.0, rms_norm_eps=1e-6)
    c = Eagle3Config.for_target(tc, VD)
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == \
        (H, 64, 4, 2, 8)
    assert (c.vocab_size, c.draft_vocab_size, c.target_hidden_size, c.rms_norm_eps) == (V, VD, H, 1e-6)
    assert c.rope_theta == 12345.0 and Eagle3Config.for_target(tc, VD, rope_theta=7.0).rope_theta == 7.0
    assert c.layers_for(6) == default_aux_layers(6) == (2, 3, 3)


def test_card_names_its_data_and_its_command_reproduces_the_arguments(tmp_path):
    """The exported head's card says what it was trained on (ShareGPT or the templated prompts), and its
    'Reproduce' command parses back to the same training arguments."""
    import shlex

    from switchsd.training.card import write_card
    from switchsd.training.eagle3 import parser
    argv = ["--sharegpt", "~/.cache/switchsd/eagle3/sharegpt", "--answers", "692", "--tf-answers", "2990",
            "--steps", "200", "--lr", "0.0005", "--draft-vocab", "12288", "--init", "assets/h", "--revocab",
            "--out", str(tmp_path)]
    args = parser().parse_args(argv)
    args.bf16 = False
    meta = {"source": "sharegpt", "answers": 692, "tf_answers": 2990, "train_samples": 3682, "val_samples": 186,
            "max_context": 256, "draft_vocab": 12288, "coverage": 0.97, "val_coverage": 0.96, "steps": 200,
            "val_acc_all": [0.33, 0.28], "log": []}
    write_card(tmp_path, meta, args, "smollm2")
    card = (tmp_path / "README.md").read_text()
    assert "ShareGPT" in card and "692 prompts" in card and "2990 of ShareGPT's own answers" in card
    assert "templates" not in card and "0.330, 0.280" in card
    cmd = card.split("Reproduce: `")[1].split("`")[0]
    again = parser().parse_args(shlex.split(cmd)[4:])      # after "python -m switchsd train-eagle3"
    for k in ("sharegpt", "answers", "tf_answers", "steps", "lr", "draft_vocab", "init", "revocab", "out", "ttt"):
        assert getattr(again, k) == getattr(args, k), k
    meta = {**meta, "source": "folder", "answers": 1152, "tf_answers": 0}
    args = parser().parse_args(["--prompts", "1152", "--out", str(tmp_path)])
    args.bf16 = False
    write_card(tmp_path, meta, args, "smollm2")
    card = (tmp_path / "README.md").read_text()
    assert "ShareGPT" not in card and "1152 prompts of `switchsd/training/prompts.py`" in card
    assert json.loads((tmp_path / "training.json").read_text())["source"] == "folder"


def test_data_stage_with_nothing_to_write_loads_no_model(tmp_path, monkeypatch, capsys):
    """`--stage data` with ShareGPT answers (written by regen_sharegpt) or --prompts 0 returns before loading the
    target; with prompts to answer it loads it in --gen-dtype."""
    from switchsd.training import eagle3

    loads = []

    def fake_load(name, dtype):
        loads.append(dtype)
        raise RuntimeError("stop here")

    monkeypatch.setattr(eagle3, "load_model", fake_load)
    eagle3.main(["--work", str(tmp_path), "--stage", "data", "--sharegpt", str(tmp_path)])
    eagle3.main(["--work", str(tmp_path), "--stage", "data", "--prompts", "0"])
    assert loads == [] and "regen-sharegpt" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="stop here"):
        eagle3.main(["--work", str(tmp_path), "--stage", "data", "--prompts", "8", "--gen-dtype", "bfloat16"])
    assert loads == ["bfloat16"]
