"""Command-line plumbing: flags shared by the entry points (read from the config dataclasses) and `generate`."""
