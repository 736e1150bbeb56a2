"""Probe lab: train a copy-intent probe for the loaded model, in the browser.

`switchsd probe collect` and `switchsd probe train` (the very commands of the command line) run in a child process
on the bundled CopyDiversity and RealText sets, small: a quick check of what the probe reads on this model, not the
shipped probe's full run. The new probe joins the lab's choices and becomes the probe of the next Generate run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from switchsd.core.probe import ProbeError, load_probe
from switchsd.models.loading import DEFAULT_MODEL, cache_dir

from .resources import Resources, UserError

QUICK = dict(n=48, n_realtext=24, max_new_tokens=64)      # prompts per set, tokens each: minutes on 2 CPU cores
ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], what: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}      # the studio's threads (app.py --threads)
    r = subprocess.run([sys.executable, "-m", "switchsd", "probe", *args], cwd=ROOT, capture_output=True, text=True,
                       env=env)
    if r.returncode:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"probe {what} failed: {tail[:300]}")


def train_probe(res: Resources, progress=None) -> tuple[str, dict]:
    """Collect and train a probe for the studio's model; returns (its name in the lab, its metadata). The probe is
    then the one the Generate tab uses."""
    model = res.model_name or DEFAULT_MODEL
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = cache_dir() / "studio-probes" / stamp
    data = out / "data"
    step = (lambda f, msg: progress(f, desc=msg)) if progress is not None else (lambda f, msg: None)
    step(0.05, f"collecting completions and hidden states ({QUICK['n']} + {QUICK['n_realtext']} bundled prompts)")
    _run(["collect", "--model", model, "--out", str(data), "--n", str(QUICK["n"]), "--n-realtext",
          str(QUICK["n_realtext"]), "--max-new-tokens", str(QUICK["max_new_tokens"])], "collect")
    step(0.8, "training a probe per layer")
    _run(["train", "--data", str(data), "--out", str(out / "probe"), "--model", model], "train")
    path = out / "probe.safetensors"
    try:
        probe = res.worker.call(load_probe, path, res.lm().model)
    except ProbeError as e:
        raise UserError(str(e)) from None
    name = f"trained here {stamp}"
    res.add_trained(name, path, probe)
    step(1.0, "done")
    return name, probe.meta
