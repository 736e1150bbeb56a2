"""Target completions and per-site hidden states for probe training/evaluation.

`complete`: batched greedy generation by the target (chat template), resumable JSONL cache.
`decision_features`: the same positions of a few completed records, one unpadded float32 forward each.
`site_features`: one batched forward per chunk over prompt + completion, capturing every (layer, "attn"|"mlp")
site; keeps the decision-aligned positions of `labels.aligned_pairs` and writes a safetensors chunk per batch
({"<layer>:<sub>": [n, d] fp16, "labels": [n], "sample": [n]}), skipped when it already exists.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from switchsd.io import cut_at_eos, left_padded, length_batches, read_jsonl, right_padded, save_safetensors_atomic
from switchsd.models.capture import HiddenCapture
from switchsd.models.loading import LoadedModel

from .labels import aligned_pairs


def all_sites(model) -> list[tuple[int, str]]:
    return [(l, s) for l in range(model.config.num_hidden_layers) for s in ("attn", "mlp")]


def site_key(site: tuple[int, str]) -> str:
    return f"{site[0]}:{site[1]}"


@torch.inference_mode()
def complete(lm: LoadedModel, rows: list[dict], out: Path, max_new_tokens: int = 192, batch: int = 16,
             chat: bool = True) -> list[dict]:
    """rows {"id", "prompt"} -> rows + {"prompt_ids", "completion_ids"}; cached in `out` (JSONL)."""
    done = {r["id"]: r for r in read_jsonl(out)} if out.exists() else {}
    todo = [r for r in rows if r["id"] not in done]
    tok = lm.tokenizer
    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    eos = lm.eos_ids()
    todo.sort(key=lambda r: len(r["prompt"]))
    with open(out, "a") as f:
        for i in tqdm(range(0, len(todo), batch), desc="target completions", unit="batch"):
            chunk = todo[i:i + batch]
            enc = [lm.encode(r["prompt"], chat=chat) for r in chunk]
            ids, att = left_padded(enc, pad, lm.device)                             # [B, P]
            P = ids.shape[1]
            seqs = lm.model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new_tokens,
                                     do_sample=False, pad_token_id=pad)
            for r, e, s in zip(chunk, enc, seqs):
                comp = cut_at_eos(s[P:].tolist(), eos)
                rec = {**r, "prompt_ids": e, "completion_ids": comp}
                done[r["id"]] = rec
                f.write(json.dumps(rec) + "\n")
            f.flush()
    return [done[r["id"]] for r in rows]


@torch.inference_mode()
def site_features(lm: LoadedModel, seqs: list[tuple[int, list[int], int]], out: Path, n_train: int = 5,
                  tokens_per_batch: int = 4096, desc: str = "hidden states") -> None:
    """seqs: (sample id, tokens, start of the generated part). Writes out/chunk_XXXXX.safetensors."""
    out.mkdir(parents=True, exist_ok=True)
    sites = all_sites(lm.model)
    chunks = length_batches(seqs, lambda s: len(s[1]), tokens_per_batch)
    with HiddenCapture(lm.model, sites) as cap:
        for ci, chunk in enumerate(tqdm(chunks, desc=desc, unit="chunk")):
            path = out / f"chunk_{ci:05d}.safetensors"
            if path.exists():
                continue
            ids, att = right_padded([t for _, t, _ in chunk], lm.device)                 # [B, T]
            lm.model(input_ids=ids, attention_mask=att, logits_to_keep=1)
            feats = {site_key(s): [] for s in sites}
            labels, sample = [], []
            for b, (sid, t, start) in enumerate(chunk):
                pos, lab = aligned_pairs(t, start, n_train)
                if not pos:
                    continue
                idx = torch.tensor(pos, device=lm.device)
                for s in sites:
                    feats[site_key(s)].append(cap.last[s][b].index_select(0, idx).to(torch.float16).cpu())
                labels += lab
                sample += [sid] * len(pos)
            if not labels:
                continue
            tensors = {k: torch.cat(v).contiguous() for k, v in feats.items()}
            tensors["labels"] = torch.tensor(labels, dtype=torch.uint8)
            tensors["sample"] = torch.tensor(sample, dtype=torch.int64)
            save_safetensors_atomic(tensors, path)


@torch.inference_mode()
def decision_features(lm: LoadedModel, recs: list[dict], sites: list[tuple[int, str]], n_train: int = 5
                      ) -> tuple[dict[tuple[int, str], torch.Tensor], torch.Tensor, torch.Tensor]:
    """recs {"prompt_ids", "completion_ids"} -> ({site: [N, d] float32}, labels [N] bool, record index [N]) at the
    decision positions of every record (records with none are skipped)."""
    feats, labels, owner = {s: [] for s in sites}, [], []
    with HiddenCapture(lm.model, sites) as cap:
        for i, r in enumerate(recs):
            toks = r["prompt_ids"] + r["completion_ids"]
            pos, lab = aligned_pairs(toks, len(r["prompt_ids"]), n_train)
            if pos:
                lm.model(input_ids=torch.tensor([toks], device=lm.device), logits_to_keep=1)
                for s in sites:
                    feats[s].append(cap.last[s][0, pos].float().cpu())
                labels += lab
                owner += [i] * len(pos)
    return {s: torch.cat(v) for s, v in feats.items()}, torch.tensor(labels, dtype=torch.bool), torch.tensor(owner)


def load_site(folder: Path, key: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features [N, d] fp16, labels [N] bool, sample ids [N]) of one site across all chunks."""
    xs, ys, ss = [], [], []
    for path in sorted(folder.glob("chunk_*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            xs.append(f.get_tensor(key))
            ys.append(f.get_tensor("labels").bool())
            ss.append(f.get_tensor("sample"))
    if not xs:
        raise FileNotFoundError(f"no feature chunks in {folder}")
    return torch.cat(xs), torch.cat(ys), torch.cat(ss)
