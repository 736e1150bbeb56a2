"""Measurement: the benchmark, transformers' own generate as peer rows, datasets, mismatch explanations, the
analyses (copy regime, drafting tax) and the temperature sweep."""
