"""The shared data helpers (switchsd/io.py)."""
import json

import pytest
import torch

from switchsd.io import (
    cut_at_eos,
    left_padded,
    length_batches,
    read_jsonl,
    right_padded,
    save_safetensors_atomic,
    write_text_atomic,
)


def test_read_jsonl_skips_blanks_and_names_the_bad_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert read_jsonl(p) == [{"a": 1}, {"a": 2}]
    p.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(ValueError, match=r"x.jsonl: row 2 is not valid JSON"):
        read_jsonl(p)


def test_atomic_writes_replace_and_leave_no_temporary(tmp_path):
    p = tmp_path / "out.json"
    write_text_atomic(p, json.dumps({"v": 1}))
    write_text_atomic(p, json.dumps({"v": 2}))
    assert json.loads(p.read_text()) == {"v": 2}
    save_safetensors_atomic({"w": torch.arange(3.0)}, tmp_path / "w.safetensors", {"k": "v"})
    from safetensors import safe_open
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        assert f.metadata() == {"k": "v"} and torch.equal(f.get_tensor("w"), torch.arange(3.0))
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.json", "w.safetensors"]


def test_padding_sides_and_eos_cut():
    ids, att = left_padded([[5, 6, 7], [8]], pad=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and att.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, att = right_padded([[5, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and att.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert cut_at_eos([1, 2, 9, 3, 9], {9}) == [1, 2, 9]
    assert cut_at_eos([1, 2], {9}) == [1, 2]


def test_length_batches_respect_the_token_budget():
    items = [[0] * n for n in (1, 9, 3, 3, 4, 20)]
    batches = length_batches(items, len, 10)
    assert sorted(len(x) for b in batches for x in b) == sorted(len(x) for x in items)
    assert all(max(len(x) for x in b) * len(b) <= 10 or len(b) == 1 for b in batches)
