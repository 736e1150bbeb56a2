"""Hostile or careless input, each refused with one clear line (or handled safely), with nothing lost: lone
surrogates, non-UTF-8 standard input, an upload path naming a server file, a probe from another model of the same
shape, and each configuration the vLLM gate refuses. (Over the studio's API with the real model:
tests/test_app_hardening.py.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import make_tiny_model

from switchsd.core.probe import Probe, ProbeError, load_probe, model_signature
from switchsd.io import check_text, decode_utf8

ROOT = Path(__file__).resolve().parents[1]
LONE = "Repeat: \ud800 then stop"


def test_lone_surrogates_and_bad_bytes_are_named():
    assert check_text("plain text, ünïcödé, 漢字") == "plain text, ünïcödé, 漢字"
    with pytest.raises(ValueError, match=r"lone surrogate U\+D800 at character 8"):
        check_text(LONE)
    with pytest.raises(ValueError, match="byte 0xff at offset 3"):
        decode_utf8(b"abc\xffdef")


def test_the_studio_refuses_a_lone_surrogate_before_the_model():
    from app import handlers, probelab, verifylab
    from app.resources import Resources, UserError
    res = Resources()
    with pytest.raises(UserError, match="lone surrogate"):
        handlers.check_prompt(res, LONE, True)
    with pytest.raises(UserError, match="lone surrogate"):
        probelab.score_text(res, [object()], ["p"], LONE, False)
    with pytest.raises(UserError, match="lone surrogate"):
        verifylab.run(res, LONE, "lossless", None, 1.0, 8)
    assert not res._lms                      # nothing was loaded for a refused prompt


@pytest.mark.parametrize("stdin,argv,msg", [
    (b"\xff\xfeRepeat this", ["--prompt", "-"], "standard input is not UTF-8 text: byte 0xff at offset 0"),
    (b"", [b"--prompt", b"Repeat \xff this"], "the prompt is not valid Unicode text: a lone surrogate U+DCFF"),
])
def test_generate_refuses_undecodable_input_in_one_line(stdin, argv, msg):
    r = subprocess.run([sys.executable.encode(), b"-m", b"switchsd", b"generate",
                        *[a if isinstance(a, bytes) else a.encode() for a in argv]],
                       input=stdin, capture_output=True, cwd=ROOT, timeout=120)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2 and msg in err and "Traceback" not in err, err


def test_an_upload_path_naming_a_server_file_is_refused(tmp_path):
    from gradio.utils import get_upload_folder

    from app.resources import Resources, UserError
    res = Resources()
    shipped = ROOT / "probes" / "smollm2-135m-instruct.safetensors"
    inside = Path(get_upload_folder()) / "x" / ".." / ".." / "etc"
    for path in ("/etc/passwd", str(shipped), str(inside), str(tmp_path / "missing.safetensors"), "", "\x00"):
        with pytest.raises(UserError, match="not an uploaded file"):
            res.load_upload(path)
    link = Path(get_upload_folder()) / "switchsd-test-link.safetensors"       # a link out of the folder
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(shipped)
    try:
        with pytest.raises(UserError, match="not an uploaded file"):
            res.load_upload(str(link))
    finally:
        link.unlink()


def _probe_for(model, tmp_path, **meta_change) -> Path:
    cfg = model.config
    meta = {"hidden_size": cfg.hidden_size, "num_layers": cfg.num_hidden_layers, "model": "tiny",
            **model_signature(model), **meta_change}
    path = tmp_path / "probe.safetensors"
    Probe(torch.randn(cfg.hidden_size), 1, "attn", 0.5, meta).save(path)
    return path


def test_a_probe_from_another_model_of_the_same_shape_is_refused(tmp_path):
    model = make_tiny_model()
    assert load_probe(_probe_for(model, tmp_path), model).layer == 1
    for change, key in (({"vocab_size": 80}, "vocab_size"), ({"model_type": "qwen3"}, "model_type"),
                        ({"num_key_value_heads": 4}, "num_key_value_heads")):
        with pytest.raises(ProbeError, match=f"{key} .*another model of the same shape"):
            load_probe(_probe_for(model, tmp_path, **change), model)


def _vllm_config(model, method="eagle3", sample="greedy", padded=True, eager=True):
    spec = SimpleNamespace(method=method, draft_sample_method=sample, disable_padded_drafter_batch=not padded)
    return SimpleNamespace(speculative_config=spec,
                           model_config=SimpleNamespace(hf_config=model.config, enforce_eager=eager))


def test_each_refusal_of_the_vllm_gate_s_setup(tmp_path):
    from switchsd.vllm.gate import GateError, check_setup
    model = make_tiny_model()
    good = _probe_for(model, tmp_path)
    assert check_setup(_vllm_config(model), str(good)).layer == 1
    cases = [(dict(method="ngram"), "wraps EAGLE-3"), (dict(sample="probabilistic"), "greedy drafting"),
             (dict(padded=False), "padded drafter batch"), (dict(eager=False), "--enforce-eager")]
    for kw, msg in cases:
        with pytest.raises(GateError, match=msg):
            check_setup(_vllm_config(model, **kw), str(good))
    with pytest.raises(GateError, match="does not exist"):
        check_setup(_vllm_config(model), str(tmp_path / "missing.safetensors"))
    other = make_tiny_model(vocab=80)               # same width and depth, another vocabulary
    with pytest.raises(GateError, match="vocab_size 64 .*another model of the same shape"):
        check_setup(_vllm_config(other), str(good))
