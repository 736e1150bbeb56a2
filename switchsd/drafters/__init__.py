"""Drafters behind one protocol (base.py): context copy (copy, pld, copyspec), EAGLE-3 (the head block and its
drafter), a small draft model (SPS), and the oracle used by the benchmark."""
