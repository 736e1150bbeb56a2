"""SwitchSD: speculative decoding that switches between context copying and neural drafting.

Architecture (read in this order):
    models.py     load the target model (offline SmolLM2 default, or any HF causal LM)
    config.py     frozen dataclasses: every default (sampling, engine, copy, tree, neural shape, gate)
    tree.py       candidates -> token trie -> (tokens, positions, 4-D tree mask)
    verify.py     pure acceptance rules (greedy, lossless sampling); p = target, q = draft
    cache.py      explicit KV cache object with rollback to the accepted path
    capture.py    hidden-state capture (after attention / after MLP) from the verify forward
    drafters/     the drafter protocol; context copy (copy, pld, copyspec), EAGLE-3, SPS, oracle
    costs.py      the device's verification cost curve, online acceptance estimates, drafter timers
    policies.py   which drafter runs at each step (fixed, the paper's gate, the cost gate, BanditSpec)
    engine.py     the one decode loop; yields a StepEvent per step
    events.py     StepEvent and the statistics computed from events
    methods.py    method name -> (policy, drafters)
    factory.py    method name + configs -> Engine (the CLIs, the bench and the studio build here)
    peers.py      transformers' own generate / prompt lookup / assisted generation, as benchmark rows
Entry points: python -m switchsd.generate | switchsd.eval.bench | switchsd.target.calibrate
"""

__version__ = "0.1.0"
