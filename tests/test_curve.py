"""The verification cost curve tool (`python -m switchsd.eval.curve`): our side's protocol."""
import pytest

from switchsd.eval import curve


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from families import tiny_folder
    from gguf_files import write_gguf
    from transformers import AutoModelForCausalLM
    out = tmp_path_factory.mktemp("curve")
    folder, _, _ = tiny_folder("llama", out)
    return write_gguf(AutoModelForCausalLM.from_pretrained(folder), out / "llama-tiny.gguf")


def test_row_counts_are_measured_in_turn_after_one_context(tiny_gguf, monkeypatch):
    """Every round runs each row count once, in turn (a drift of the machine meets each alike), every forward after
    the same `depth` tokens; the first round is a warm-up, the medians come from the rest."""
    from switchsd.models.q4q8 import Q4Q8Llama
    calls, real = [], Q4Q8Llama.forward

    def forward(self, ids, cache, *a, **k):
        calls.append((ids.shape[1], len(cache)))
        return real(self, ids, cache, *a, **k)

    monkeypatch.setattr(Q4Q8Llama, "forward", forward)
    out = curve.ours(tiny_gguf, rows=(1, 2, 4), depth=16, repeats=3)
    assert calls[0] == (16, 0)                                  # the context
    assert calls[1:] == [(r, 16) for _ in range(4) for r in (1, 2, 4)]
    assert out["format"] == "q4q8" and set(out["ms"]) == {1, 2, 4} and all(v > 0 for v in out["ms"].values())


def test_repeats_below_one_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        curve.main(["--model", "x.gguf", "--repeats", "0"])
    assert "--repeats must be >= 1" in capsys.readouterr().err
