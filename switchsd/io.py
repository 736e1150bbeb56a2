"""Small helpers shared by the data pipelines (probes, EAGLE-3 self-distillation, benchmarks, calibration):
JSONL reading, atomic writes, padded batches and length-bucketed packing."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

import torch

T = TypeVar("T")


MAX_ROW_BYTES = 8 << 20      # one JSONL row above 8 MB is a wrong file, not a prompt


def read_jsonl(path: str | Path, objects: bool = False, max_row_bytes: int = MAX_ROW_BYTES) -> list:
    """Every non-blank line of a JSONL file (gzip-compressed where the name ends in .gz). A bad line raises
    ValueError naming the file and row: not valid JSON, longer than `max_row_bytes`, or (with `objects`) not a
    JSON object."""
    rows = []
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:                 # bytes, decoded line by line: errors name the right row
        # a line is read up to one byte past the limit, so a huge one is refused without reading it whole
        for i, raw in enumerate(iter(lambda: f.readline(max_row_bytes + 1), b""), 1):
            if len(raw) > max_row_bytes:
                size, part = len(raw), raw
                while part and not part.endswith(b"\n"):      # measure the rest of the row without keeping it
                    part = f.readline(1 << 20)
                    size += len(part)
                raise ValueError(f"{path}: row {i} is {size / 2**20:.1f} MB, over the "
                                 f"{max_row_bytes / 2**20:.0f} MB a row may hold")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path}: row {i} is not UTF-8 text") from None
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: row {i} is not valid JSON ({e.msg})") from None
                if objects and not isinstance(row, dict):
                    raise ValueError(f"{path}: row {i} is {type(row).__name__ if row is not None else 'null'}, "
                                     f"not a JSON object")
                rows.append(row)
    return rows


def check_text(text: str, what: str = "the prompt") -> str:
    """`text` if it is valid Unicode (encodable as UTF-8), else ValueError naming the first bad character: a lone
    surrogate (from an API client's JSON, or non-UTF-8 command-line bytes) never reaches the tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} is not valid Unicode text: a lone surrogate U+{ord(text[e.start]):04X} at "
                         f"character {e.start}") from None
    return text


def decode_utf8(data: bytes, what: str = "standard input") -> str:
    """Bytes as UTF-8 text, else ValueError naming the first bad byte and its offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start}") from None


def stop_process(proc, timeout: float = 10.0) -> None:
    """Terminate a child process (a server), killing it if it does not end within `timeout` seconds."""
    import subprocess
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tmp(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp{os.getpid()}")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` so that readers see the old file or the new one, never half of it."""
    path = Path(path)
    tmp = _tmp(path)
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def save_safetensors_atomic(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict | None = None) -> None:
    """safetensors' save_file through a temporary name: an interrupted run never leaves a truncated file."""
    from safetensors.torch import save_file
    path = Path(path)
    tmp = _tmp(path)
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(path)


def left_padded(seqs: Sequence[Sequence[int]], pad: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts for batched generation: (ids [B, P], attention mask [B, P]) padded on the left."""
    P = max(len(s) for s in seqs)
    ids = torch.tensor([[pad] * (P - len(s)) + list(s) for s in seqs], device=device)
    att = torch.tensor([[0] * (P - len(s)) + [1] * len(s) for s in seqs], device=device)
    return ids, att


def right_padded(seqs: Sequence[Sequence[int]], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences for one teacher-forced forward: (ids [B, T], mask [B, T]) padded on the right, so every row's
    positions start at 0 and its hidden states line up with a single-sequence forward."""
    T = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    att = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(list(s), dtype=torch.long)
        att[b, :len(s)] = 1
    return ids.to(device), att.to(device)


def cut_at_eos(tokens: Sequence[int], eos: Iterable[int]) -> list[int]:
    """`tokens` up to and including the first end-of-sequence token."""
    eos = set(eos)
    cut = next((j for j, t in enumerate(tokens) if t in eos), None)
    return list(tokens[:cut + 1] if cut is not None else tokens)


def length_batches(items: Sequence[T], length: Callable[[T], int], tokens_per_batch: int) -> list[list[T]]:
    """Sort by length and pack greedily so that (longest in batch) x (batch size) <= tokens_per_batch
    (a longer item than that gets a batch of its own). Deterministic: same items -> same batches."""
    out: list[list[T]] = []
    cur: list[T] = []
    for it in sorted(items, key=length):      # ascending: the newest item is the batch's longest
        if cur and length(it) * (len(cur) + 1) > tokens_per_batch:
            out.append(cur)
            cur = []
        cur.append(it)
    if cur:
        out.append(cur)
    return out
