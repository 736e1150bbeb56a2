"""EAGLE-3's regeneration step at throughput: the target answers many prompts greedily, continuous batching on the
lean forward, and the fused features come out of the same forwards (no second pass).

    gen = Regenerator(lm, layers=(2, 15, 27), slots=32, max_new_tokens=512)
    for key, sample in gen.run(prompts): ...      # prompts: [(key, prompt_ids)]; sample as in training.data

Each slot of a `BatchedKV` holds one request at its own length: a new prompt is prefilled alone into a free slot
(one causal forward), then every decode step is one forward over all active slots, each row attending to its own
keys (an additive mask per row). Greedy tokens of a row are the target's in the loaded format, up to the rounding
of a batched product (this is training data, not a lossless output). A sample is
`{"ids": [T] int32, "aux": [T-1, 3H] fp16, "final": [T-1, H] fp16, "start": prompt length}`: features at
positions 0..T-2 (the last token is never fed), the layout of `switchsd.training.data` shards.
"""
from __future__ import annotations

import ctypes
from typing import Iterable, Iterator

import torch

from ..models.forward import own_forward
from ..models.loading import LoadedModel
from ..serve.batched import BatchedKV, batched_forward


def _malloc_trim() -> None:
    """Hand freed heap memory back to the OS. A long loop of varying-size tensors otherwise grows the process by
    ~35 MB per decode step (glibc serves them from a heap that never shrinks: 14 GB in 4 minutes, measured);
    a fixed mmap threshold stops that but made each step ~3x slower (every large tensor faulted in afresh)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Regenerator:
    def __init__(self, lm: LoadedModel, layers: tuple[int, int, int], slots: int = 32, max_new_tokens: int = 512,
                 max_prompt: int = 1536):
        self.lm, self.slots, self.max_new, self.max_prompt = lm, slots, max_new_tokens, max_prompt
        self.lean = own_forward(lm.model)
        self.eos = lm.eos_ids()
        last = self.lean.n_layers - 1
        # hidden_states index i (the input to layer i) = site (i - 1, "mlp"); the final state is normed later
        self.sites = [(i - 1, "mlp") for i in layers] + [(last, "mlp")]
        self.cache = BatchedKV(self.lean, slots, max_prompt + max_new_tokens + 1)

    def _features(self, cap: dict, rows: slice | int) -> tuple[torch.Tensor, torch.Tensor]:
        aux = torch.cat([cap[s][rows] for s in self.sites[:3]], -1)                 # [.., 3H]
        final = self.lean._rms(cap[self.sites[3]][rows], self.lean.norm)           # [.., H]
        return aux.to(torch.float16), final.to(torch.float16)

    @torch.inference_mode()
    def run(self, prompts: Iterable[tuple[object, list[int]]]) -> Iterator[tuple[object, dict]]:
        lean, cache = self.lean, self.cache
        todo = iter(prompts)
        active: list[dict] = []                    # slot i <-> active[i]
        steps = 0
        dev = lean.device
        while True:
            while len(active) < self.slots:        # admit: prefill one prompt into the next free slot
                nxt = next(todo, None)
                if nxt is None:
                    break
                key, ids = nxt
                if not 0 < len(ids) <= self.max_prompt:
                    continue
                slot = len(active)
                cache.lens[slot] = 0
                x = torch.tensor(ids, device=dev)[None]
                logits, cap = batched_forward(lean, x, cache, torch.arange(len(ids), device=dev)[None], None,
                                              self.sites, rows=[len(ids)], first_slot=slot)
                aux, final = self._features(cap, 0)                                # [P, 3H], [P, H]
                first = int(logits[-1].argmax())
                active.append({"key": key, "ids": list(ids) + [first], "start": len(ids),
                               "aux": [aux], "final": [final]})
            if not active:
                return
            steps += 1
            if steps % 32 == 0:
                _malloc_trim()
            b = len(active)
            lens = torch.tensor(cache.lens[:b], device=dev)                           # [b]
            S = int(lens.max()) + 1
            mask = torch.zeros(b, 1, 1, S, dtype=lean.dtype, device=dev)
            mask.masked_fill_((torch.arange(S, device=dev)[None] > lens[:, None])[:, None, None], torch.finfo(lean.dtype).min)
            x = torch.tensor([[r["ids"][-1]] for r in active], device=dev)            # [b, 1]
            logits, cap = batched_forward(lean, x, cache, lens[:, None], mask, self.sites, grouped=True)
            aux, final = self._features(cap, slice(None))                             # [b, 1, 3H], [b, 1, H]
            nxt_tok = logits.argmax(-1).tolist()
            done = []
            for r, row in enumerate(active):
                row["aux"].append(aux[r])
                row["final"].append(final[r])
                row["ids"].append(int(nxt_tok[r]))
                new = len(row["ids"]) - row["start"]
                if nxt_tok[r] in self.eos or new >= self.max_new:
                    done.append(r)
            for r in sorted(done, reverse=True):
                row = active[r]
                yield row["key"], {"ids": torch.tensor(row["ids"], dtype=torch.int32),
                                   "aux": torch.cat(row["aux"])[:len(row["ids"]) - 1].cpu().contiguous(),
                                   "final": torch.cat(row["final"])[:len(row["ids"]) - 1].cpu().contiguous(),
                                   "start": row["start"]}
                last = len(active) - 1
                if r != last:
                    cache.move(last, r)
                    active[r] = active[last]
                active.pop()
