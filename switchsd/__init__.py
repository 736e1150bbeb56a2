"""SwitchSD: speculative decoding that switches between context copying and neural drafting.

The package, by role (read in this order; README.md has the file-by-file map):
    core/        the decoding algorithm: configs (every default), token tree, verification rules (lossless and
                 the lab's lossy ones), KV cache, probe, costs, policies (which drafter runs each step), the
                 engine loop and its StepEvents, SMC-SD
    drafters/    the drafter protocol; context copy (copy, pld, copyspec), EAGLE-3, SPS, oracle
    models/      the target model on this device: loading, the forward the engine drives (lean or
                 transformers'), hidden-state capture, the calibrated verification cost curve
    factory.py   options -> Engine (+ drafters, probe); typed SetupError
    io.py        JSONL, atomic writes, padded batches
    eval/        benchmark, peers (transformers' generate), datasets, analyses, temperature sweep
    training/    EAGLE-3 self-distillation
    cli/         the flags the commands share
Commands: python -m switchsd generate | bench | calibrate | analysis | tempsweep | train_eagle3 | quality
"""

__version__ = "0.1.0"
