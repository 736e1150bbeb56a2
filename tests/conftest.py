"""Shared fixtures: a tiny random Llama in float64 (exact enough that greedy argmax never flips between
the engine's tree/cached forwards and a plain full forward), a "peaked" copy of it for sampling tests,
and the real offline model for tests marked `real`."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import make_tiny_model

# The suite's own device curves (tests/data/calibration/README.md): the real-model tests decide with curves measured
# on a quiet CPU, and nothing the suite measures under its own load reaches a user's ~/.cache/switchsd/calibration.
_SEEDS = Path(__file__).parent / "data" / "calibration"
_CALIBRATION = Path(__file__).parent / "artifacts" / "calibration"


def _seed_calibration() -> None:
    _CALIBRATION.mkdir(parents=True, exist_ok=True)
    for f in _SEEDS.glob("*.json"):
        names = [f.name] + ([f.name.replace("-int4-lean-attn-float32", "-int4-lean")] if "-attn-" in f.name else [])
        for name in names:                      # atomic: two pytest workers may seed at once
            tmp = _CALIBRATION / f".{name}.{os.getpid()}"
            shutil.copyfile(f, tmp)
            os.replace(tmp, _CALIBRATION / name)


os.environ["SWITCHSD_CALIBRATION"] = str(_CALIBRATION)
_seed_calibration()

# One intra-op thread: the tiny models run thousands of sub-millisecond forwards where threads only add
# synchronisation, and on a small shared CPU (2 cores here) multi-threaded forwards thrash as soon as another
# process is busy (measured: the 135M model 6-20x slower with 2 threads under load than with 1).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    has_cuda = torch.cuda.is_available()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(no_gpu)
        if "real" in item.keywords:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_model():
    """vocab 64, hidden 32, 2 layers, 4 heads / 2 kv heads, max_position_embeddings 256, eos 1, float64."""
    return make_tiny_model()


@pytest.fixture(scope="session")
def peaked_model():
    """The same tiny model with its logits scaled x30 (final norm weight), so T=1 sampling is peaked
    (top token ~0.6) and copy drafts are accepted often enough for sampling tests to have power."""
    return make_tiny_model(logit_scale=30.0)


@pytest.fixture(scope="session")
def real_lm():
    """SmolLM2-135M-Instruct, offline, float32 on CPU. Skips when the offline model package is missing."""
    from switchsd.models.loading import ModelLoadError, load_model
    try:
        lm = load_model(dtype="float32", device="cpu")
    except ModelLoadError as e:  # pragma: no cover - depends on the environment
        pytest.skip(f"real model unavailable: {e}")
    return lm

