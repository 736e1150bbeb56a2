"""One parsed `GGUFReader` per file, shared by every step of a load.

gguf-py parses every metadata field in Python when a reader opens, the tokenizer's vocabulary and merges included
(~100k strings: seconds for a real file); a load asks a file for its types, architecture, sizes and tensors, so the
reader is opened once. A file changed on disk (size or modification time) is read afresh.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import torch


@lru_cache(maxsize=4)
def _open(path: str, mtime_ns: int, size: int):
    from gguf import GGUFReader
    return GGUFReader(path)


def reader(path: str | Path):
    """The file's `GGUFReader` (OSError for a missing file; gguf-py's errors for one it cannot parse)."""
    p = Path(path).resolve()
    st = p.stat()
    return _open(str(p), st.st_mtime_ns, st.st_size)


def forget() -> None:
    """Close the readers (their parsed metadata holds hundreds of MB for a large vocabulary)."""
    _open.cache_clear()


def architecture(path: str | Path) -> str:
    """The file's `general.architecture` ("llama", "qwen3", ...; "" when it names none)."""
    field = reader(path).fields.get("general.architecture")
    return bytes(field.parts[field.data[0]]).decode() if field is not None else ""


def _reverse_permute(n_rows: int, n_head: int) -> torch.Tensor:
    """The row order transformers' GGUF loader gives q/k (llama.cpp stores rotary halves interleaved)."""
    idx = torch.arange(n_rows)
    return idx.reshape(n_head, n_rows // n_head // 2, 2).transpose(1, 2).reshape(-1)


def rotary_rows(arch: str, short: str, n_rows: int, config) -> torch.Tensor | None:
    """The row order that undoes llama.cpp's interleaved rotary halves in q / k (`short` "attn_q" / "attn_k"; its
    converter interleaves them for the llama architecture only, an unnamed one read as llama), or None where the
    file's rows are transformers' order."""
    if arch not in ("llama", "") or short not in ("attn_q", "attn_k"):
        return None
    return _reverse_permute(n_rows, config.num_attention_heads if short == "attn_q" else config.num_key_value_heads)


@contextmanager
def shared():
    """While open, gguf-py's `GGUFReader(path)` (transformers' config and tokenizer readers call it) returns this
    module's reader of that file instead of parsing it again."""
    import gguf
    own = gguf.GGUFReader

    def opened(path, mode="r"):
        return reader(path) if mode == "r" else own(path, mode)
    gguf.GGUFReader = opened
    try:
        yield
    finally:
        gguf.GGUFReader = own
