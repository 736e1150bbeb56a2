"""Where the EAGLE-3 trainer's samples come from, as one `TrainingData`:

- `sharegpt_data`: the long job's splits (`python -m switchsd regen-sharegpt`): the target's own answers to
  ShareGPT prompts (`train`, validated on the held-out `val`), plus ShareGPT's own answers with teacher-forced
  features (`tf`); ShareGPT's reply token counts rank the draft vocabulary beside the answers;
- `folder_data`: the self-distillation shards in the work folder (`switchsd.training.data`, templated prompts),
  plus `--extra` completions; a random 5% validates.
Samples are dicts {ids [T], aux [T-1, 3H], final [T-1, H], start} (switchsd.training.data's layout).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from .data import load_samples


@dataclass(frozen=True)
class TrainingData:
    train: list[dict]
    val: list[dict]
    n_base: int                                  # training samples of the primary source (the rest: tf / extra)
    extra_counts: torch.Tensor | None = None     # [V] token counts ranked with the answers' for the draft vocab
    source: str = "folder"                       # "sharegpt" | "folder"


def clip_context(s: dict, keep: int) -> dict:
    """The sample with at most `keep` prompt positions before its answer (features are per position, so a
    clipped sample is the same positions' features, seen with less context by the head)."""
    cut = max(0, s["start"] - keep)
    if cut == 0:
        return s
    return {**s, "ids": s["ids"][cut:], "aux": s["aux"][cut:], "final": s["final"][cut:], "start": s["start"] - cut}


def sharegpt_data(lm, state: Path, answers: int | None, tf_answers: int, max_context: int | None) -> TrainingData:
    """The first `answers` regenerated and `tf_answers` teacher-forced training samples (prompt-list order) and
    the whole validation split, each clipped to `max_context` prompt positions as it loads (0 / None: all)."""
    from .regen_job import load_split, sharegpt_reply_counts
    max_context = max_context or None
    train = load_split(state, "train", answers, max_context)
    n_base = len(train)
    if tf_answers:
        train += load_split(state, "tf", tf_answers, max_context)
    val = load_split(state, "val", None, max_context)
    if not train or not val:
        raise SystemExit(f"no ShareGPT answers in {state} (train {len(train)}, val {len(val)}): run "
                         "python -m switchsd regen-sharegpt first")
    return TrainingData(train, val, n_base, sharegpt_reply_counts(lm, state), "sharegpt")


def folder_data(work: Path, n_extra: int, rng: random.Random, max_context: int | None) -> TrainingData:
    """The work folder's self-distillation shards (`data/`, `extra_<i>/`), shuffled by `rng`, 5% held out."""
    samples = load_samples(work / "data")
    n_base = len(samples)
    for i in range(n_extra):
        samples += load_samples(work / f"extra_{i}")
    if not samples:
        raise SystemExit(f"no training samples in {work}/data: run with --prompts N (or --sharegpt STATE)")
    rng.shuffle(samples)
    n_val = max(1, len(samples) // 20)
    val, train = samples[:n_val], samples[n_val:]
    if max_context:
        train, val = ([clip_context(s, max_context) for s in ss] for ss in (train, val))
    return TrainingData(train, val, n_base)
