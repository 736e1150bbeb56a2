"""SwitchSD: speculative decoding that switches between context copying and neural drafting.

Architecture (read in this order):
    models.py     load the target model (offline SmolLM2 default, or any HF causal LM)
    config.py     frozen dataclasses for sampling and engine settings
    tree.py       candidates -> token trie -> (tokens, positions, 4-D tree mask)
    verify.py     pure acceptance rules (greedy, lossless sampling); p = target, q = draft
    cache.py      explicit KV cache object with rollback to the accepted path
    capture.py    hidden-state capture (after attention / after MLP) from the verify forward
    drafters/     the drafter protocol and the context-copy drafters (copy, pld, copyspec)
    policies.py   which drafter runs at each step
    engine.py     the one decode loop; yields a StepEvent per step
    events.py     StepEvent and the statistics computed from events
    methods.py    method name -> (policy, drafters)
Entry points: python -m switchsd.generate | switchsd.bench | switchsd.calibrate
"""

__version__ = "0.1.0"
