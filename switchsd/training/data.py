"""Self-distillation data for an EAGLE-3 head: the target answers our prompt set (batched greedy generation)
and we keep, per token, the three fused features and the target's final hidden state (its logits are
`lm_head(final)`, recomputed at train time on the draft vocabulary).

Shards `feat_00000.safetensors`, ... hold per sample `{i}.ids` [T] (prompt + response), `{i}.aux` [T-1, 3H]
(input to target layers low/mid/high, fp16), `{i}.final` [T-1, H] (fp16) and `{i}.start` (prompt length).
Features exist for positions 0..T-2 (the last token is never processed). Finished shards are skipped, so
an interrupted run resumes where it stopped.

`from_completions` adds samples the target already wrote elsewhere (e.g. the probe pipeline's CopyDiversity
completions, JSONL rows with `prompt_ids` + `completion_ids`): one teacher-forced forward per batch yields the
same features as generation would, at a fraction of the cost.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from ..io import cut_at_eos, left_padded, length_batches, read_jsonl, right_padded, save_safetensors_atomic
from ..models.loading import LoadedModel


@torch.inference_mode()
def generate_shard(lm: LoadedModel, prompts: list[str], layers: tuple[int, int, int], max_new_tokens: int) -> dict:
    tok, model = lm.tokenizer, lm.model
    enc = [lm.encode(p, chat=True) for p in prompts]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids, att = left_padded(enc, pad, lm.device)                                            # [B, P]
    P = ids.shape[1]
    out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new_tokens, do_sample=False,
                         output_hidden_states=True, return_dict_in_generate=True, pad_token_id=pad)
    seqs = out.sequences                                                                   # [B, P + N]
    # hidden_states: per generated step, a tuple over (embeddings, layer 1..L-1 outputs, final normed)
    per_layer = lambda i: torch.cat([h[i] for h in out.hidden_states], 1)                 # [B, P + N - 1, H]
    aux = torch.cat([per_layer(i) for i in layers], -1)                                    # input to layer i
    final = per_layer(-1)
    eos = lm.eos_ids()
    shard = {}
    for b, e in enumerate(enc):
        resp = cut_at_eos(seqs[b, P:].tolist(), eos)
        T = len(e) + len(resp)
        lo = P - len(e)
        shard[f"{b}.ids"] = torch.tensor(e + resp, dtype=torch.int32)
        shard[f"{b}.aux"] = aux[b, lo:lo + T - 1].to(torch.float16).contiguous()
        shard[f"{b}.final"] = final[b, lo:lo + T - 1].to(torch.float16).contiguous()
        shard[f"{b}.start"] = torch.tensor([len(e)], dtype=torch.int32)
    return shard


def build(lm: LoadedModel, prompts: list[str], out: Path, layers: tuple[int, int, int], max_new_tokens: int = 256,
          batch: int = 32) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # sort by prompt length within blocks of 8 shards, so padding stays small and a run stopped early still
    # covers the whole prompt mix; shard order is deterministic
    block = 8 * batch
    order = [i for s in range(0, len(prompts), block)
             for i in sorted(range(s, min(s + block, len(prompts))), key=lambda i: len(prompts[i]))]
    chunks = [order[i:i + batch] for i in range(0, len(order), batch)]
    for si, chunk in enumerate(tqdm(chunks, desc="target answers + features", unit="shard")):
        path = out / f"feat_{si:05d}.safetensors"
        if path.exists():
            continue
        save_safetensors_atomic(generate_shard(lm, [prompts[i] for i in chunk], layers, max_new_tokens), path)


@torch.inference_mode()
def forward_features(lm: LoadedModel, items: list[tuple[object, list[int], int]], layers: tuple[int, int, int]
                     ) -> list[tuple[object, dict]]:
    """Features by one teacher-forced forward over known sequences (one batch): items (key, ids, prompt length)
    -> [(key, sample)], a sample as in the shards (`ids` [T] int32, `aux` [T-1, 3H] fp16, `final` [T-1, H] fp16,
    `start`). The same features as generation would give, at a fraction of the cost."""
    ids, att = right_padded([it[1] for it in items], lm.device)                 # [B, T]
    hs = lm.model(input_ids=ids, attention_mask=att, output_hidden_states=True,
                  logits_to_keep=1).hidden_states                               # (emb, layer outputs.., final normed)
    aux = torch.cat([hs[i] for i in layers], -1)                                # [B, T, 3H] inputs to the fused layers
    out = []
    for b, (key, seq, start) in enumerate(items):
        n = len(seq) - 1
        out.append((key, {"ids": torch.tensor(seq, dtype=torch.int32), "aux": aux[b, :n].to(torch.float16).clone(),
                          "final": hs[-1][b, :n].to(torch.float16).clone(), "start": start}))
    return out


def shard_tensors(samples: list[dict]) -> dict[str, torch.Tensor]:
    """Samples -> the tensors of one shard file (`{i}.ids`, `{i}.aux`, `{i}.final`, `{i}.start`)."""
    tensors = {}
    for i, s in enumerate(samples):
        tensors.update({f"{i}.ids": s["ids"], f"{i}.aux": s["aux"], f"{i}.final": s["final"],
                        f"{i}.start": torch.tensor([s["start"]], dtype=torch.int32)})
    return tensors


def from_completions(lm: LoadedModel, jsonl: Path, out: Path, layers: tuple[int, int, int],
                     tokens_per_batch: int = 4096) -> int:
    """Completions already written by the target -> shards in the format above. Returns the sample count."""
    rows = [r for r in read_jsonl(jsonl) if r.get("completion_ids")]
    chunks = length_batches(rows, lambda r: len(r["prompt_ids"]) + len(r["completion_ids"]), tokens_per_batch)
    out.mkdir(parents=True, exist_ok=True)
    for si, chunk in enumerate(tqdm(chunks, desc=f"features of {jsonl.name}", unit="shard")):
        path = out / f"feat_{si:05d}.safetensors"
        if path.exists():
            continue
        items = [(b, r["prompt_ids"] + r["completion_ids"], len(r["prompt_ids"])) for b, r in enumerate(chunk)]
        save_safetensors_atomic(shard_tensors([s for _, s in forward_features(lm, items, layers)]), path)
    return len(rows)


def read_sample(f, b: str, max_context: int | None = None) -> dict:
    """Sample `b` of an open shard (`safetensors.safe_open`), with at most `max_context` prompt positions before
    its answer: the dropped positions' features are never read."""
    start = int(f.get_tensor(f"{b}.start")[0])
    cut = max(0, start - max_context) if max_context is not None else 0
    return {"ids": f.get_tensor(f"{b}.ids")[cut:].long(), "aux": f.get_slice(f"{b}.aux")[cut:],
            "final": f.get_slice(f"{b}.final")[cut:], "start": start - cut}


def load_samples(folder: Path) -> list[dict]:
    samples = []
    for path in sorted(folder.glob("feat_*.safetensors")):
        with safe_open(str(path), "pt") as f:
            samples += [read_sample(f, b) for b in sorted({k.split(".")[0] for k in f.keys()}, key=int)]
    return samples
