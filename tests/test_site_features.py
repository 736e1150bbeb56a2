"""`probes.features.site_features`: the batched, right-padded forward writes, for every sample, exactly the
hidden states a forward over that sample alone gives at the aligned positions, with the copy labels."""
from __future__ import annotations

import torch
from helpers import make_tiny_model, random_prompt, repetitive_prompt
from safetensors.torch import load_file

from probes.features import all_sites, site_features, site_key
from probes.labels import aligned_pairs
from switchsd.models.loading import LoadedModel


def test_batched_features_equal_single_sequence_forwards(tmp_path):
    model = make_tiny_model()
    lm = LoadedModel(model, tokenizer=None, name="tiny")
    seqs = [(i, repetitive_prompt(i, n=6 + 2 * i, reps=2) if i % 2 else random_prompt(i, 9 + 3 * i), 3 + i)
            for i in range(5)]                                             # ragged lengths: right padding
    site_features(lm, seqs, tmp_path, n_train=3, tokens_per_batch=64, desc="test")
    chunks = sorted(tmp_path.glob("chunk_*.safetensors"))
    assert chunks
    got = [load_file(str(c)) for c in chunks]
    sample = torch.cat([g["sample"] for g in got]).tolist()
    labels = torch.cat([g["labels"] for g in got]).tolist()
    feats = {site_key(s): torch.cat([g[site_key(s)] for g in got]) for s in all_sites(model)}
    row = 0
    by_id = {sid: (t, start) for sid, t, start in seqs}
    for sid in dict.fromkeys(sample):                                      # in the order they were written
        tokens, start = by_id[sid]
        pos, lab = aligned_pairs(tokens, start, 3)
        with torch.no_grad():
            hs = model(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states
        n = len(pos)
        assert sample[row:row + n] == [sid] * n and labels[row:row + n] == [int(x) for x in lab]
        L = model.config.num_hidden_layers
        for layer in range(L):
            got_l = feats[site_key((layer, "mlp"))][row:row + n]           # output of layer `layer` (float16)
            if layer < L - 1:
                torch.testing.assert_close(got_l, hs[layer + 1][0, pos].to(torch.float16), rtol=0, atol=1e-3)
            else:                       # transformers' last hidden state carries the final norm; the site does not
                with torch.no_grad():
                    normed = model.model.norm(got_l.double())
                torch.testing.assert_close(normed, hs[L][0, pos], rtol=0, atol=5e-3)
        row += n
    assert row == len(sample)
