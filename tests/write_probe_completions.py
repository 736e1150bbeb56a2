"""(Re)write tests/data/probe_completions.jsonl.gz: the offline model's greedy completions (token ids only) of the
held-out prompt sets that tests/test_probes.py scores the shipped probe on.

    python tests/write_probe_completions.py

The tests check the stored rows rather than trust them (prompt ids must match; >= 99% of completion tokens must be
the target's argmax after their prefix), and generate any missing row themselves. Run this after changing a set,
the default model or its chat template. float32, HF generate in batches of 16 (as the tests would).
"""
from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

from test_probes import STORED, stored_sets  # run as a script, this folder is first on the import path

from probes.features import complete
from switchsd.models.loading import load_model

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    lm = load_model(dtype="float32", device="cpu")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (rows, max_new_tokens) in stored_sets().items():
            recs = complete(lm, rows, Path(tmp) / f"{name}.jsonl", max_new_tokens=max_new_tokens, batch=16)
            out += [{"set": name, "id": r["id"], "prompt_ids": r["prompt_ids"], "completion_ids": r["completion_ids"]}
                    for r in recs]
    with gzip.open(STORED, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in out)
    print(f"{len(out)} completions -> {STORED.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
