"""`switchsd probe collect` + `train` end to end on a model of another family (a tiny random Qwen3 with the offline
model's tokenizer): the bundled sets only, a probe and its card written, the probe carrying the model's fingerprint
and loading for it, and refused by the offline model."""
import json
import subprocess
import sys

import pytest
from families import qwen3_folder

from switchsd.core.probe import ProbeError, load_probe
from switchsd.models.loading import load_model


@pytest.mark.slow
def test_collect_and_train_a_probe_for_a_qwen3_model(tmp_path, real_lm):
    folder, _, _ = qwen3_folder(tmp_path)
    data, out = tmp_path / "data", tmp_path / "probe"
    run = lambda *a: subprocess.run([sys.executable, "-m", "switchsd", "probe", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=900)
    r = run("collect", "--model", str(folder), "--out", str(data), "--n", "24", "--n-realtext", "16",
            "--max-new-tokens", "48")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run("train", "--data", str(data), "--out", str(out), "--model", str(folder))
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "probe.json").read_text())
    assert len(report["per_layer"]) == 4 and (tmp_path / "probe.md").exists()   # 2 layers x (attn, mlp); the card
    lm = load_model(str(folder), "float32", "cpu")
    probe = load_probe(out.with_suffix(".safetensors"), lm.model)
    assert probe.meta["fingerprint"]["model_type"] == "qwen3"
    with pytest.raises(ProbeError, match="another model"):
        load_probe(out.with_suffix(".safetensors"), real_lm.model)
