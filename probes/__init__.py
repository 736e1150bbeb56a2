"""Copy-intent probes: data collection, per-layer linear probe training and evaluation.

Entry points (`switchsd probe collect | train | evaluate`) and the shipped probe for the offline
default model live here; `switchsd/core/probe.py` loads a probe file and scores the hidden state the engine captures.
"""
