"""A user's own GGUF file: any block type the C forward reads, the shipped probe and head found by the model's
fingerprint whatever the file, one clear line for what cannot be read."""
import pytest
import torch
from gguf_files import mixed_offline_gguf
from helpers import drafted_accepted

from switchsd.core.config import EngineConfig
from switchsd.core.fingerprint import fingerprint, mismatch
from switchsd.factory import Drafters, SetupError, build_engine, shipped_for
from switchsd.models.loading import ModelLoadError, load_model, readable_formats


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return mixed_offline_gguf(tmp_path_factory.mktemp("gguf"))


@pytest.mark.real
def test_a_mixed_file_decodes_in_its_own_blocks_and_finds_the_shipped_probe_and_head(mixed):
    assert readable_formats(mixed) == ("q4q8",)                 # int4 reads Q4 layers only
    lm = load_model(str(mixed), "auto", "cpu")
    assert lm.precision == "q4q8"
    fwd = lm.model._switchsd_q4q8
    kinds = {type(p).__name__ + str(getattr(p, "kind", "")) for p in fwd.mats}
    assert len(kinds) >= 4, kinds                               # Q5_0, Q8_0, Q5_1 and Q4_1 parts
    assert shipped_for(lm, "probe").name == "smollm2-135m-instruct.safetensors"
    assert shipped_for(lm, "eagle3").name == "eagle3-smollm2-135m"
    drafters = Drafters(lm)
    prompt = lm.encode("Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox", chat=True)
    cfg = EngineConfig(max_new_tokens=32)
    want = build_engine("vanilla", lm, drafters, cfg).run(prompt).token_ids
    for method in ("switchsd-paper", "eagle3@chain3", "copy"):
        gen = build_engine(method, lm, drafters, cfg).run(prompt)
        assert gen.token_ids == want, method
        assert drafted_accepted(gen)[0] > 0, method


@pytest.mark.real
def test_dtype_int4_names_what_it_cannot_read(mixed):
    with pytest.raises(ModelLoadError, match=r"--dtype int4 reads Q4_0, Q4_1 blocks; smollm2-mixed.gguf has Q5_0"):
        load_model(str(mixed), "int4", "cpu")


@pytest.mark.parametrize("cut", [10, 4096, 50_000_000])
def test_a_truncated_or_corrupt_gguf_is_one_line(mixed, tmp_path, cut):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(mixed.read_bytes()[:cut])
    with pytest.raises(ModelLoadError) as e:
        load_model(str(bad), "auto", "cpu")
    assert "\n" not in str(e.value) and "bad.gguf" in str(e.value)


def test_not_a_gguf_is_one_line(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello")
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        load_model(str(bad), "auto", "cpu")


def test_fingerprint_tells_models_apart(tiny_model):
    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab
    a = fingerprint(tiny_model, Tok({f"t{i}": i for i in range(64)}))
    tiny_model._switchsd_fingerprint = None
    b = fingerprint(tiny_model, Tok({f"u{i}": i for i in range(64)}))
    assert mismatch(a, a) is None and "vocabulary" in mismatch(a, b)
    assert "hidden_size" in mismatch(a, {**a, "hidden_size": 7})


@pytest.mark.real
def test_another_models_probe_and_head_are_refused(real_lm, tmp_path):
    import json
    import shutil

    from switchsd.core.probe import ProbeError, load_probe
    from switchsd.factory import DEFAULT_HEADS, DEFAULT_PROBES
    probe = load_probe(DEFAULT_PROBES["smollm2-135m-instruct"])
    probe.meta["fingerprint"] = {**probe.meta["fingerprint"], "vocab": "0123456789abcdef"}
    probe.save(tmp_path / "other.safetensors")
    with pytest.raises(ProbeError, match="vocabulary 0123456789abcdef"):
        load_probe(tmp_path / "other.safetensors", real_lm.model)
    head = tmp_path / "head"
    shutil.copytree(DEFAULT_HEADS["smollm2-135m-instruct"], head)
    cfg = json.loads((head / "config.json").read_text())
    cfg["switchsd_fingerprint"]["vocab"] = "0123456789abcdef"
    (head / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SetupError, match="belongs to another model"):
        _ = Drafters(real_lm, eagle=str(head)).head
    assert torch.equal(load_probe(DEFAULT_PROBES["smollm2-135m-instruct"], real_lm.model).weight, probe.weight)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def family_gguf(request, tmp_path_factory):
    """A tiny model of each family as a GGUF laid out as llama.cpp's converter lays it out (llama's q / k rows
    interleaved, Qwen2's biases, Qwen3's q / k norms), its matrices Q4_K, Q6_K, Q5_0, Q8_0 in turn."""
    from families import tiny_folder
    from gguf_files import write_gguf
    from transformers import AutoModelForCausalLM
    out = tmp_path_factory.mktemp(request.param)
    folder, _, _ = tiny_folder(request.param, out)
    return write_gguf(AutoModelForCausalLM.from_pretrained(folder), out / f"{request.param}-tiny.gguf")


def test_a_lone_gguf_of_each_family_runs_in_its_own_blocks(family_gguf):
    """Architecture, sizes, rope and tokenizer from the file alone: the C forward's logits within the activations'
    8-bit rounding of transformers' forward over the file's de-quantised weights (a wrong rope, norm, bias or row
    order is off by the logits' scale), and every method's tokens equal vanilla's."""
    lm = load_model(str(family_gguf), "auto", "cpu")
    assert lm.precision == "q4q8"
    fwd = lm.model._switchsd_q4q8
    ids = lm.encode("Repeat exactly: the quick brown fox jumps over the lazy dog.", chat=True)
    lg, _ = fwd.forward(torch.tensor([ids]), fwd.new_cache(256))
    assert lm.model.model.layers[0].mlp.down_proj.weight.is_meta      # the matrices: the file's blocks only
    with pytest.raises(RuntimeError, match="loaded in the q4q8 format"):
        lm.model(torch.tensor([ids]))
    ref = load_model(str(family_gguf), "float32", "cpu").model(torch.tensor([ids])).logits[0]
    assert (lg - ref).abs().max() / ref.abs().max() < 0.05
    cfg = EngineConfig(max_new_tokens=24)
    drafters = Drafters(lm)
    want = build_engine("vanilla", lm, drafters, cfg).run(ids).token_ids
    for method in ("copy", "pld", "copyspec", "samd", "lookahead"):
        assert build_engine(method, lm, drafters, cfg).run(ids).token_ids == want, method
    with pytest.raises(SetupError, match="no shipped probe"):     # another model: the offline model's are not its
        _ = Drafters(lm).probe


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_int4_reads_each_familys_row_order(family, tmp_path):
    """llama.cpp interleaves q / k rotary halves for the llama architecture only: int4 on a Q4_0 file of either
    family equals the dense model of the same file (int4-float32: exactly), and a file with biases offers no int4."""
    from families import tiny_folder
    from gguf_files import write_gguf
    from transformers import AutoModelForCausalLM
    folder, _, _ = tiny_folder(family, tmp_path)
    g = write_gguf(AutoModelForCausalLM.from_pretrained(folder), tmp_path / f"{family}-q40.gguf", kinds=("Q4_0",))
    dense = load_model(str(g), "float32", "cpu")
    ids = torch.tensor([dense.encode("Repeat exactly: the quick brown fox.", chat=True)])
    ref = dense.model(ids).logits[0]
    assert torch.equal(load_model(str(g), "int4-float32", "cpu").model(ids).logits[0].float(), ref)
    q2, _, _ = tiny_folder("qwen2", tmp_path / "q2")
    biased = write_gguf(AutoModelForCausalLM.from_pretrained(q2), tmp_path / "qwen2-q40.gguf", kinds=("Q4_0",))
    assert readable_formats(biased) == ("q4q8",)
