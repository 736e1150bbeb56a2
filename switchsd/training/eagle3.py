"""Train an EAGLE-3 head for a target model by self-distillation, on CPU or GPU.

    python -m switchsd train-eagle3 --model smollm2-135m-instruct --work runs/eagle3 \
        --prompts 2000 --epochs 3 --out runs/eagle3/head
    python -m switchsd train-eagle3 --sharegpt ~/.cache/switchsd/eagle3/sharegpt --steps 200 --out runs/head

Stages (each resumes): 1. the target answers a varied prompt set (switchsd.training.prompts, never benchmark
questions) and its fused features are cached (switchsd.training.data), or the samples come from the ShareGPT
job's state (switchsd.training.sources); 2. a reduced draft vocabulary from token
counts (d2t / t2d); 3. training-time test (TTT): K chained steps, step k feeding the head its own previous
output, attention = causal keys of step 0 + same-position keys of steps 1..k (as at inference, where a
depth-k node sees the context and its own chain); soft cross-entropy against the target's distribution
renormalised on the draft vocabulary, weights 0.8^k; 4. export in the published layout (bf16 safetensors).
Checkpoints (safetensors + JSON) are written every --save-every steps.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from ..drafters.eagle3_model import Eagle3Config, Eagle3Head, default_aux_layers, save_eagle3
from ..io import length_batches, save_safetensors_atomic, write_text_atomic
from ..models.loading import cpu_has_native_bf16, load_model
from .card import write_card
from .data import build, from_completions
from .prompts import build_prompts
from .sources import folder_data, sharegpt_data


def build_vocab(samples: list[dict], draft_vocab: int, vocab: int, extra_counts: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Most frequent response tokens (plus `extra_counts`, e.g. ShareGPT's own answers) -> (d2t [Vd] offsets,
    t2d [V] mask, coverage of the samples' response tokens)."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for s in samples:
        counts += torch.bincount(s["ids"][s["start"]:], minlength=vocab)
    rank = counts if extra_counts is None else counts + extra_counts
    used = rank.topk(draft_vocab).indices.sort().values
    d2t = used - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    coverage = float(counts[used].sum() / counts.sum())
    return d2t, t2d, coverage


def regrown(init: str, target, cfg: Eagle3Config, d2t: torch.Tensor, t2d: torch.Tensor) -> Eagle3Head:
    """A head with a new draft vocabulary (d2t / t2d) that starts from the head in `init`: every weight copied,
    lm_head rows copied for the tokens both vocabularies hold (the others keep their fresh initialisation)."""
    from ..drafters.eagle3_model import load_eagle3
    old = load_eagle3(init, target).float()
    head = Eagle3Head(cfg)
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    state = {k: v for k, v in old.state_dict().items() if not k.startswith(("lm_head", "d2t", "t2d"))}
    head.load_state_dict(state, strict=False)
    new_ids = torch.nonzero(t2d).flatten()                             # target ids, draft-id order
    old_row = torch.full((t2d.numel(),), -1, dtype=torch.long)
    old_row[torch.nonzero(old.t2d).flatten()] = torch.arange(int(old.t2d.sum()))
    src = old_row[new_ids]
    keep = src >= 0
    with torch.no_grad():
        head.lm_head.weight[keep] = old.lm_head.weight[src[keep]]
    return head.requires_grad_(True).train()


def ttt_logits(head: Eagle3Head, embed, ids: torch.Tensor, aux: torch.Tensor, K: int) -> list[torch.Tensor]:
    """Training-time test: the head drafts K steps ahead at every position at once, each step attending to the
    fused target features up to its position and to its own earlier steps there (EAGLE-3's TTT attention).
    ids [B, n+1] tokens, aux [B, n, 3H] fused target features -> K log-prob tensors [B, n, Vd]; step k at index t
    reads token x_{t+1+k} and predicts x_{t+2+k}. Step 0 is exactly `Eagle3Head.step` over the sequence."""
    c = head.config
    B, n = aux.shape[:2]
    t_idx = torch.arange(n, device=aux.device)
    h = head.fc(aux)                                                     # [B, n, H]
    scale = 1.0 / math.sqrt(c.head_dim)
    rep = c.num_attention_heads // c.num_key_value_heads
    causal = torch.ones(n, n, dtype=torch.bool, device=aux.device).tril()
    Ks, Vs, out_logits = [], [], []
    for k in range(K):
        q, kk, vv = head.qkv(embed(ids[:, (t_idx + 1 + k).clamp(max=n)]), h, t_idx + k)
        kk, vv = kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1)   # [B, heads, n, hd]
        if k == 0:
            K0, V0 = kk, vv
        else:
            Ks.append(kk)
            Vs.append(vv)
        scores = [(q @ K0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
        scores += [((q * kj).sum(-1, keepdim=True) * scale) for kj in Ks]          # own earlier steps, same t
        w = torch.softmax(torch.cat(scores, -1).float(), -1).to(q.dtype)
        attn = w[..., :n] @ V0
        for j, vj in enumerate(Vs):
            attn = attn + w[..., n + j:n + j + 1] * vj
        h = head.finish(h, head.midlayer.self_attn.o_proj(attn.transpose(1, 2).reshape(B, n, -1)))
        out_logits.append(torch.log_softmax(head.logits(h).float(), -1))          # [B, n, Vd]
    return out_logits


def ttt_loss(head: Eagle3Head, embed, teacher_w: torch.Tensor, batch: list[dict], K: int, decay: float = 0.8):
    """Training-time test over a batch of samples. Returns (loss, per-step accuracy list, n positions).

    Teacher = the target's distribution renormalised on the draft vocabulary (`teacher_w` = the target's output
    embedding rows of the draft ids). Unlike the official trainer, positions whose full-vocabulary argmax lies
    outside the draft vocabulary are kept (computing it costs a full-vocabulary product per batch)."""
    c = head.config
    dev = teacher_w.device
    n = max(len(s["ids"]) - 1 for s in batch)            # feature positions per sample (padded)
    B = len(batch)
    ids = torch.zeros(B, n + 1, dtype=torch.long, device=dev)
    aux = torch.zeros(B, n, 3 * c.target_hidden_size, device=dev)
    fin = torch.zeros(B, n, c.target_hidden_size, device=dev)
    valid = torch.zeros(B, n + 1, dtype=torch.bool, device=dev)     # token index is a real response token
    length = torch.zeros(B, dtype=torch.long, device=dev)
    for b, s in enumerate(batch):
        T = len(s["ids"])
        ids[b, :T] = s["ids"]
        aux[b, :T - 1] = s["aux"].float()
        fin[b, :T - 1] = s["final"].float()
        valid[b, s["start"]:T] = True
        length[b] = T - 1
    with torch.no_grad(), torch.autocast(dev.type, enabled=False):
        teach = torch.log_softmax(fin @ teacher_w.T, -1)                # [B, n, Vd]: target at position j
    t_idx = torch.arange(n, device=dev)
    total, accs, count = 0.0, [], 0
    for k, logits in enumerate(ttt_logits(head, embed, ids, aux, K)):
        # teacher: the target's distribution at position t+1+k (it predicts x_{t+2+k})
        tj = t_idx + 1 + k
        ok = (tj[None] < length[:, None]) & valid[:, (t_idx + 2 + k).clamp(max=n)]
        p = teach[:, tj.clamp(max=n - 1)].exp()
        loss_k = -(p * logits).sum(-1)
        cnt = ok.sum().clamp(min=1)
        total = total + (decay ** k) * (loss_k * ok).sum() / cnt
        accs.append(float(((logits.argmax(-1) == p.argmax(-1)) & ok).sum() / cnt))
        count = int(ok.sum()) if k == 0 else count
    return total, accs, count


def batches(samples: list[dict], tokens_per_batch: int, rng: random.Random) -> list[list[dict]]:
    out = length_batches(samples, lambda s: len(s["ids"]), tokens_per_batch)
    rng.shuffle(out)
    return out


def val_agreement(head: Eagle3Head, embed, teacher_w: torch.Tensor, val: list[dict], args, dev_type: str) -> list:
    """Top-1 agreement with the target per TTT step over the validation samples' answer positions."""
    with torch.no_grad(), torch.autocast(dev_type, dtype=torch.bfloat16, enabled=args.bf16):
        vl = [ttt_loss(head, embed, teacher_w, b, args.ttt) for b in
              batches(val, args.tokens_per_batch, random.Random(0))]
    return [sum(a[1][k] * a[2] for a in vl) / max(1, sum(a[2] for a in vl)) for k in range(args.ttt)]


def save_ckpt(work: Path, head: Eagle3Head, opt: torch.optim.Optimizer, state: dict) -> None:
    tensors = {f"head.{k}": v.contiguous() for k, v in head.state_dict().items()}
    names = {id(p): n for n, p in head.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if st:
                tensors[f"m.{names[id(p)]}"] = st["exp_avg"].contiguous()
                tensors[f"v.{names[id(p)]}"] = st["exp_avg_sq"].contiguous()
                state.setdefault("adam_step", {})[names[id(p)]] = float(st["step"])
    save_safetensors_atomic(tensors, work / "ckpt.safetensors")
    write_text_atomic(work / "ckpt.json", json.dumps(state))


def load_ckpt(work: Path, head: Eagle3Head, opt: torch.optim.Optimizer) -> dict | None:
    if not (work / "ckpt.safetensors").exists():
        return None
    t = load_file(str(work / "ckpt.safetensors"))
    state = json.loads((work / "ckpt.json").read_text())
    head.load_state_dict({k[5:]: v for k, v in t.items() if k.startswith("head.")})
    for n, p in head.named_parameters():
        if f"m.{n}" in t:
            opt.state[p] = {"exp_avg": t[f"m.{n}"], "exp_avg_sq": t[f"v.{n}"],
                            "step": torch.tensor(state["adam_step"][n])}
    return state


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", "--target", dest="model", default=None,
                    help="target model (default: offline SmolLM2-135M-Instruct); --target is the old name")
    ap.add_argument("--work", default="runs/eagle3", help="cache folder for data and checkpoints")
    ap.add_argument("--out", default="runs/eagle3/head", help="where the head is written (the shipped one is "
                    "assets/eagle3-smollm2-135m: pass it explicitly to replace it)")
    ap.add_argument("--prompts", type=int, default=2000, help="prompts the target answers (0: only reuse the "
                    "shards already cached in WORK/data)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-set", type=int, choices=(1, 2), default=2,
                    help="switchsd.training.prompts version (1: the set the shipped head was first trained on)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--gen-dtype", default="float32", help="dtype of the target while it writes the data "
                    "(bfloat16 is ~2x faster on CPUs with AVX-512 BF16; training always reads fp32 weights)")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--rope-theta", type=float, default=None, help="default: the target's")
    ap.add_argument("--ttt", type=int, default=7, help="training-time-test steps K (EAGLE-3's recipe: 7)")
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: --epochs' worth)")
    ap.add_argument("--tokens-per-batch", type=int, default=4096)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--time-budget", type=float, default=None, metavar="MIN", help="train for about MIN minutes: "
                    "after 10 steps the step count (and its cosine schedule) is cut to what fits")
    ap.add_argument("--val-limit", type=int, default=64, help="validation samples scored at each checkpoint "
                    "(all of them once training ends)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bfloat16 autocast for the head's matmuls (master weights stay float32); default: on GPUs "
                    "and on CPUs with native bf16 (AVX-512 BF16 / AMX), off where it would be emulated")
    ap.add_argument("--extra", action="append", default=[], metavar="JSONL",
                    help="more samples the target already wrote (rows with prompt_ids + completion_ids, e.g. "
                    "runs/probes/<m>/copydiversity/completions.jsonl); never pass benchmark completions")
    ap.add_argument("--sharegpt", default=None, metavar="STATE", help="train on the ShareGPT answers of "
                    "`python -m switchsd regen-sharegpt` in STATE (its val split validates); no prompt generation")
    ap.add_argument("--answers", type=int, default=None, help="with --sharegpt: the first N training answers "
                    "(the data-scaling curve's prefixes)")
    ap.add_argument("--tf-answers", type=int, default=0, help="with --sharegpt: also the first N teacher-forced "
                    "samples (ShareGPT's own answers, `regen_sharegpt --teacher-forced`)")
    ap.add_argument("--max-context", type=int, default=256, help="prompt positions kept before each answer "
                    "(the head attends to at most this much context in training; all of it at inference)")
    ap.add_argument("--revocab", action="store_true", help="with --init: a new draft vocabulary of --draft-vocab "
                    "tokens from the training answers (weights copied, lm_head rows of shared tokens too)")
    ap.add_argument("--lm-head-init", choices=["random", "target"], default="random",
                    help="target: the head's lm_head starts as the target's output rows of the draft vocabulary")
    ap.add_argument("--stage", choices=["all", "data", "train", "export", "eval"], default="all",
                    help="eval: only the validation agreement of --init (or the checkpoint in --work)")
    ap.add_argument("--init", default=None, help="start from this published-format head (its draft vocabulary "
                    "is kept), e.g. to continue training the shipped head on new data")
    return ap


def init_head(args, lm, cfg: Eagle3Config, d2t: torch.Tensor, t2d: torch.Tensor, train: list,
              coverage: float) -> tuple[Eagle3Head, Eagle3Config, torch.Tensor, float]:
    """The head training starts from: regrown from --init on a new draft vocabulary, --init as it is, or new."""
    tc = lm.model.config
    if args.init and args.revocab:
        head = regrown(args.init, lm.model, cfg, d2t, t2d)
    elif args.init:
        from ..drafters.eagle3_model import load_eagle3
        head = load_eagle3(args.init, lm.model).float().requires_grad_(True).train()
        cfg, t2d = head.config, head.t2d.clone()
        counts = sum(torch.bincount(s["ids"][s["start"]:], minlength=tc.vocab_size) for s in train)
        coverage = float(counts[t2d].sum() / counts.sum())
    else:
        head = Eagle3Head(cfg)
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
        if args.lm_head_init == "target":
            with torch.no_grad():
                head.lm_head.weight.copy_(lm.model.get_output_embeddings().weight[t2d].float())
    return head, cfg, t2d, coverage


def train_loop(args, head: Eagle3Head, embed, teacher_w: torch.Tensor, train: list, val: list, opt, params: list,
               sched, state: dict, total_steps: int, steps_per_epoch: int, dev_type: str, work: Path) -> None:
    """TTT steps until `total_steps` (fitted to --time-budget after 10 steps), resumable: validation and a
    checkpoint every --save-every steps."""
    bar = tqdm(total=total_steps, initial=state["step"], desc="TTT training", unit="step")
    epoch = state["step"] // steps_per_epoch
    t_start, first = time.time(), state["step"]
    while state["step"] < total_steps:
        for bi, batch in enumerate(batches(train, args.tokens_per_batch, random.Random(args.seed + epoch))):
            if epoch * steps_per_epoch + bi < state["step"]:
                continue
            if state["step"] >= total_steps:
                break
            for g in opt.param_groups:
                g["lr"] = args.lr * sched(state["step"], total_steps)
            with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=args.bf16):
                loss, accs, _ = ttt_loss(head, embed, teacher_w, batch, args.ttt)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            state["step"] += 1
            bar.update()
            if args.time_budget and state["step"] == first + 10:
                # fit the schedule to the budget: the cosine ends when the time does (a lent accelerator's run)
                per_step = (time.time() - t_start) / 10
                fit = int((args.time_budget * 60 - 10 * per_step) / per_step)
                total_steps = max(state["step"], min(total_steps, state["step"] + fit))
                bar.total = total_steps
                tqdm.write(f"{per_step:.3f} s/step: {total_steps} steps fit the {args.time_budget} min budget")
            bar.set_postfix(loss=f"{loss.item():.3f}", acc0=f"{accs[0]:.3f}", accK=f"{accs[-1]:.3f}")
            if state["step"] % args.save_every == 0 or state["step"] == total_steps:
                vacc = val_agreement(head, embed, teacher_w, val[:args.val_limit], args, dev_type)
                state["log"].append({"step": state["step"], "val_acc": vacc, "time": time.time()})
                tqdm.write(f"step {state['step']}: val acc per TTT step {[round(a, 3) for a in vacc]}")
                save_ckpt(work, head, opt, state)
        epoch += 1
    bar.close()


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    if args.bf16 is None:
        args.bf16 = torch.cuda.is_available() or cpu_has_native_bf16()
    if not torch.cuda.is_available() and "malloc" not in os.environ.get("LD_PRELOAD", ""):
        print("note: on a CPU, training runs ~1.6x faster with jemalloc (glibc returns each step's large buffers to "
              "the system and faults them back in): LD_PRELOAD=libjemalloc.so.2 python -m switchsd train-eagle3 ...")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data_stage = args.stage in ("all", "data") and not args.sharegpt    # ShareGPT data: `regen_sharegpt` writes it
    generate = data_stage and args.prompts > 0
    if args.stage == "data" and not (generate or args.extra):
        print("--stage data: nothing to write (--prompts 0, no --extra"
              + ("; ShareGPT answers come from `python -m switchsd regen-sharegpt`)" if args.sharegpt else ")"))
        return
    lm = load_model(args.model, dtype=args.gen_dtype if generate else "float32")
    lm.tokenizer.padding_side = "left"
    tc = lm.model.config
    layers = default_aux_layers(tc.num_hidden_layers)
    if data_stage:
        if generate:
            build(lm, build_prompts(args.prompts, args.seed, args.prompt_set), work / "data", layers,
                  args.max_new_tokens, args.gen_batch)
        if lm.dtype != torch.float32:
            lm = load_model(args.model, dtype="float32")
        for i, path in enumerate(args.extra):
            from_completions(lm, Path(path), work / f"extra_{i}", layers)
    if args.stage == "data":
        return
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    data = (sharegpt_data(lm, Path(args.sharegpt).expanduser(), args.answers, args.tf_answers, args.max_context)
            if args.sharegpt else folder_data(work, len(args.extra), rng, args.max_context))
    train, val = data.train, data.val
    d2t, t2d, coverage = build_vocab(train, args.draft_vocab, tc.vocab_size, data.extra_counts)
    val_counts = sum(torch.bincount(s["ids"][s["start"]:], minlength=tc.vocab_size) for s in val)
    cfg = Eagle3Config.for_target(tc, args.draft_vocab, args.rope_theta)
    head, cfg, t2d, coverage = init_head(args, lm, cfg, d2t, t2d, train, coverage)
    embed = lm.model.get_input_embeddings()
    teacher_w = lm.model.get_output_embeddings().weight[t2d].detach()          # [Vd, H], draft-id order
    params = [p for n, p in head.named_parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    steps_per_epoch = len(batches(train, args.tokens_per_batch, random.Random(0)))
    total_steps = args.steps or max(1, int(steps_per_epoch * args.epochs))
    # linear warm-up over the first 2% of the steps, then a cosine to 0 at the last (a --time-budget refits both)
    sched = lambda s, total: (min(1.0, (s + 1) / max(1, total // 50))
                              * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    state = load_ckpt(work, head, opt) or {"step": 0, "log": []}
    dev_type = lm.device.type
    if args.stage == "eval":
        acc = val_agreement(head.eval(), embed, teacher_w, val, args, dev_type)
        print(json.dumps({"head": args.init or str(work), "val_samples": len(val), "coverage": coverage,
                          "val_acc": acc}))
        return
    val_coverage = float(val_counts[t2d].sum() / val_counts.sum())
    print(f"{len(train)} train / {len(val)} val samples; draft vocab {int(t2d.sum())} covers "
          f"{100 * coverage:.2f}% of training and {100 * val_coverage:.2f}% of validation answer tokens; "
          f"{total_steps} steps")
    if args.stage in ("all", "train"):
        train_loop(args, head, embed, teacher_w, train, val, opt, params, sched, state, total_steps,
                   steps_per_epoch, dev_type, work)
    out = Path(args.out)
    save_eagle3(head, out, torch.bfloat16)
    final_val = val_agreement(head.eval(), embed, teacher_w, val, args, dev_type)
    print(f"validation agreement per TTT step ({len(val)} samples): {[round(a, 3) for a in final_val]}")
    meta = {"source": data.source, "target": lm.name, "answers": data.n_base,
            "tf_answers": len(train) - data.n_base if args.sharegpt else 0, "extra": args.extra,
            "train_samples": len(train), "val_samples": len(val), "max_context": args.max_context,
            "draft_vocab": int(t2d.sum()), "coverage": coverage, "val_coverage": val_coverage,
            "lm_head_init": args.lm_head_init, "init": args.init, "revocab": args.revocab, "ttt": args.ttt,
            "epochs": args.epochs, "lr": args.lr, "steps": state["step"], "val_acc_all": final_val,
            "val_acc": state["log"][-1]["val_acc"] if state["log"] else None, "log": state["log"]}
    write_card(out, meta, args, lm.name)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
