"""The long job that makes EAGLE-3 training data: the target answers ShareGPT prompts (greedy, continuous batching,
features from the same forwards), shard by shard, resumable across processes and machines.

    nohup python -m switchsd regen-sharegpt --answers 20000 > ~/.cache/switchsd/eagle3/regen.log 2>&1 &

State lives in `--state` (default `~/.cache/switchsd/eagle3/sharegpt`, outside the work tree):
- `sharegpt_prompts_*.jsonl` the filtered prompt list (switchsd.training.sharegpt), fixed order;
- `val/feat_*.safetensors`, `train/feat_*.safetensors`: samples in the `switchsd.training.data` layout, one file
  per `--shard` answers, written atomically, plus `{i}.key` (the prompt's key, as bytes);
- `answers.jsonl`: one row per finished answer (key, split, prompt_ids, completion_ids): the compact record of
  the expensive part (features can be recomputed from it by one teacher-forced forward);
- `progress.json`: throughput so far (tokens, seconds, tokens/s, disk per million tokens).
A restart skips every key already in `answers.jsonl` whose shard exists, so a killed job loses at most the
answers in flight. The validation split is answered first (`--val`), then training prompts in list order.
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from tqdm import tqdm

from ..drafters.eagle3_model import default_aux_layers
from ..io import length_batches, read_jsonl, save_safetensors_atomic, write_text_atomic
from ..models.loading import cpu_has_native_bf16, load_model
from .data import forward_features, read_sample, shard_tensors
from .regen import Regenerator
from .sharegpt import MissingDataError, sharegpt_prompts

DEFAULT_STATE = Path.home() / ".cache" / "switchsd" / "eagle3" / "sharegpt"
PROMPT_IDS, REPLY_COUNTS = "prompt_ids.jsonl.gz", "reply_counts.safetensors"


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def prompt_ids(lm, p: dict) -> list[int]:
    """The prompt in the chat template as token ids (stored ones where the prompt came from --prompt-ids)."""
    return p["prompt_ids"] if "prompt_ids" in p else chat_ids(lm.tokenizer, p["messages"])


def export_prompt_ids(lm, prompts: list[dict], out: Path, val: int, answers: int, max_prompt: int) -> int:
    """The prompts the job would answer (validation first, then training, <= --max-prompt tokens) as token ids,
    plus ShareGPT's reply token counts (the draft vocabulary's ranking, switchsd.training.sharegpt)."""
    from .sharegpt import reply_token_counts
    out.mkdir(parents=True, exist_ok=True)
    want = [p for p in prompts if p["split"] == "val"][:val] + [p for p in prompts if p["split"] == "train"][:answers]
    rows = [{"key": p["key"], "split": p["split"], "prompt_ids": ids} for p in want
            if len(ids := chat_ids(lm.tokenizer, p["messages"])) <= max_prompt]
    with gzip.open(out / PROMPT_IDS, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    counts = reply_token_counts(lm.tokenizer, prompts, lm.model.config.vocab_size)
    save_safetensors_atomic({"counts": counts}, out / REPLY_COUNTS)
    return len(rows)


def sharegpt_reply_counts(lm, state: Path) -> torch.Tensor:
    """ShareGPT's reply token counts [V] (the draft vocabulary's ranking), cached in the job's state folder (where
    `regen_sharegpt --prompt-ids` also puts them on a machine without the ShareGPT package)."""
    from .sharegpt import reply_token_counts, sharegpt_prompts
    path = state / REPLY_COUNTS
    if path.exists():
        return load_file(str(path))["counts"]
    counts = reply_token_counts(lm.tokenizer, sharegpt_prompts(cache=state), lm.model.config.vocab_size)
    save_safetensors_atomic({"counts": counts}, path)
    return counts


def answers_file(split: str) -> str:
    return "answers_tf.jsonl" if split == "tf" else "answers.jsonl"


def done_keys(state: Path, split: str = "train") -> set[str]:
    """Keys whose sample sits in a finished shard (a row in the answers file whose shard file exists); the
    teacher-forced split keeps its own file (its keys are the same prompts, other answers)."""
    path = state / answers_file(split)
    if not path.exists():
        return set()
    return {r["key"] for r in read_jsonl(path) if (state / r["shard"]).exists()}


def next_shard(folder: Path) -> int:
    return 1 + max((int(p.stem.split("_")[1]) for p in folder.glob("feat_*.safetensors")), default=-1)


def flush(state: Path, split: str, buf: list[tuple[str, dict]]) -> str:
    folder = state / split
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{split}/feat_{next_shard(folder):05d}.safetensors"
    tensors = shard_tensors([s for _, s in buf])
    for i, (key, _) in enumerate(buf):
        tensors[f"{i}.key"] = torch.frombuffer(bytearray(key.encode()), dtype=torch.uint8)
    save_safetensors_atomic(tensors, state / name)
    with open(state / answers_file(split), "a") as f:
        for key, s in buf:
            ids = s["ids"].tolist()
            f.write(json.dumps({"key": key, "split": split, "shard": name, "prompt_ids": ids[:s["start"]],
                                "completion_ids": ids[s["start"]:]}) + "\n")
    return name


def teacher_forced_ids(tokenizer, row: dict, max_new: int) -> tuple[list[int], int] | None:
    """ShareGPT's own answer to the prompt, in the chat template: (prompt + answer ids, prompt length), the
    answer cut at `max_new` tokens; None when the row has no answer."""
    if not row.get("reply"):
        return None
    prompt = chat_ids(tokenizer, row["messages"])
    full = tokenizer.apply_chat_template(row["messages"] + [{"role": "assistant", "content": row["reply"]}],
                                         tokenize=True)
    full = [int(t) for t in (full["input_ids"] if hasattr(full, "keys") else full)]
    if full[:len(prompt)] != prompt:
        return None
    return full[:len(prompt) + max_new], len(prompt)


def teacher_forced(lm, items: list[tuple[str, list[int], int]], layers: tuple[int, int, int],
                   tokens_per_batch: int = 4096, block: int = 256):
    """Features by one forward over known text: (key, ids, prompt length) -> (key, sample) in the regenerated
    samples' layout. Over ShareGPT's own answers this is EAGLE-1's data (no decoding); over answers the target
    wrote before (`--import-answers`) it restores their features. Items go in list order, `block` at a time
    (sorted by length inside a block only), so a job stopped early holds a random sample, not the shortest."""
    for lo in range(0, len(items), block):
        for chunk in length_batches(items[lo:lo + block], lambda it: len(it[1]), tokens_per_batch):
            yield from forward_features(lm, chunk, layers)


def export_answers(state: Path, out: Path) -> int:
    """The regenerated answers (the target's token ids and the prompt's key, no ShareGPT text: the prompt is
    rebuilt from the package on import), gzipped JSONL: what a later run or another machine imports."""
    import gzip
    rows = read_jsonl(state / "answers.jsonl") if (state / "answers.jsonl").exists() else []
    with gzip.open(out, "wt") as f:
        for r in rows:
            f.write(json.dumps({k: r[k] for k in ("key", "split", "completion_ids")}) + "\n")
    return len(rows)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="target (default: offline SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default=None, help="format the target answers in (default: bfloat16 on CPUs with "
                    "native bf16, the fastest batched decode measured there; float32 on others, which only emulate it)")
    ap.add_argument("--state", default=str(DEFAULT_STATE))
    ap.add_argument("--answers", type=int, default=20000, help="training answers to reach")
    ap.add_argument("--val", type=int, default=256, help="validation answers (answered first)")
    ap.add_argument("--slots", type=int, default=48, help="requests decoded together")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--max-prompt", type=int, default=512, help="prompt tokens, chat template included (longer "
                    "prompts are skipped: decode cost grows with the widest row)")
    ap.add_argument("--shard", type=int, default=64, help="answers per shard file")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--import-answers", default=None, metavar="FILE", help="answers exported before (gzipped "
                    "JSONL): their features by one forward each, then regeneration resumes after them")
    ap.add_argument("--export-answers", default=None, metavar="FILE", help="write the regenerated answers (token "
                    "ids) to FILE and exit")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (a lent accelerator: the whole job in minutes)")
    ap.add_argument("--export-prompt-ids", default=None, metavar="DIR", help="write the wanted prompts as token "
                    "ids (DIR/prompt_ids.jsonl.gz, no ShareGPT text beyond its tokens) and ShareGPT's reply token "
                    "counts (DIR/reply_counts.safetensors), then exit: what a machine without the ShareGPT package "
                    "(an accelerator) needs")
    ap.add_argument("--prompt-ids", default=None, metavar="DIR", help="read the prompts from --export-prompt-ids' "
                    "DIR instead of the ShareGPT package")
    ap.add_argument("--teacher-forced", type=int, default=0, metavar="N", help="instead of answering: features "
                    "over ShareGPT's own answers to N training prompts, taken from the end of the list (EAGLE-1's "
                    "data; split `tf`)")
    return ap


def _prompts(args, state: Path, ap: argparse.ArgumentParser) -> list[dict]:
    """The ShareGPT prompts (from the package, or as token ids exported before)."""
    if args.prompt_ids:
        if args.teacher_forced:
            ap.error("--teacher-forced needs ShareGPT's answers, which --prompt-ids does not hold")
        src = Path(args.prompt_ids)
        prompts = read_jsonl(src / PROMPT_IDS)
        if (src / REPLY_COUNTS).exists() and not (state / REPLY_COUNTS).exists():
            shutil.copy(src / REPLY_COUNTS, state / REPLY_COUNTS)
    else:
        try:
            prompts = sharegpt_prompts(cache=state)
        except MissingDataError as e:
            ap.error(str(e))
    return prompts


def _work(args, lm, prompts: list[dict], state: Path):
    """(items still to answer, the stream of (key, sample) that answers them, each key's split)."""
    done = done_keys(state, "tf" if args.teacher_forced else "train")
    if args.teacher_forced:
        want = [dict(p, split="tf") for p in prompts if p["split"] == "train"][::-1][:args.teacher_forced]
    else:
        want = [p for p in prompts if p["split"] == "val"][:args.val] + \
               [p for p in prompts if p["split"] == "train"][:args.answers]
    todo = [p for p in want if p["key"] not in done]
    split_of = {p["key"]: p["split"] for p in todo}
    print(f"{len(prompts)} ShareGPT prompts; {len(want) - len(todo)} of {len(want)} wanted already answered; "
          f"state {state}", flush=True)
    layers = default_aux_layers(lm.model.config.num_hidden_layers)
    if args.import_answers:
        rows = {r["key"]: r for r in read_jsonl(Path(args.import_answers)) if r["key"] not in done}
        items = [(p["key"], ids + rows[p["key"]]["completion_ids"], len(ids)) for p in todo if p["key"] in rows
                 for ids in [prompt_ids(lm, p)]]
        todo = [p for p in todo if p["key"] in rows]
        samples = teacher_forced(lm, items, layers)
    elif args.teacher_forced:
        items = [(p["key"], *got) for p in todo if (got := teacher_forced_ids(lm.tokenizer, p, args.max_new_tokens))
                 and got[1] <= args.max_prompt and len(got[0]) > got[1] + 1]
        samples = teacher_forced(lm, items, layers)
    else:
        items = [(p["key"], ids) for p in todo if len(ids := prompt_ids(lm, p)) <= args.max_prompt]
        gen = Regenerator(lm, layers, args.slots, args.max_new_tokens, args.max_prompt)
        samples = gen.run(items)
    return items, samples, split_of


def _collect(args, state: Path, items: list, samples, split_of: dict) -> None:
    """Write the answers shard by shard as they come, with the job's progress; `kill` keeps what is finished."""
    left = Counter(split_of[it[0]] for it in items)      # answers still to come per split: flush a finished split
    prog_path = state / ("progress_tf.json" if args.teacher_forced else "progress.json")
    prog = json.loads(prog_path.read_text()) if prog_path.exists() else {"tokens": 0, "prompt_tokens": 0,
                                                                          "seconds": 0.0, "answers": 0}
    bufs: dict[str, list] = {"val": [], "train": [], "tf": []}
    t0, base = time.time(), dict(prog)

    def save(split: str) -> None:
        """Flush the split's buffer, then count it: progress counts only answers on disk. Imported answers
        (features recomputed, nothing generated) are counted apart, so tokens/s stays the generation's."""
        if bufs[split]:
            flush(state, split, bufs[split])
            n = len(bufs[split])
            if args.import_answers:
                prog["imported"] = prog.get("imported", 0) + n
                positions = sum(len(s["ids"]) for _, s in bufs[split])
                prog["imported_positions"] = prog.get("imported_positions", 0) + positions
            else:
                prog["answers"] += n
                prog["tokens"] += sum(len(s["ids"]) - s["start"] for _, s in bufs[split])
                prog["prompt_tokens"] += sum(s["start"] for _, s in bufs[split])
            bufs[split] = []
        if args.import_answers:
            write_text_atomic(prog_path, json.dumps(prog, indent=1))
            return
        prog["seconds"] = base["seconds"] + time.time() - t0
        disk = sum(f.stat().st_size for sp in (("tf",) if split == "tf" else ("val", "train"))
                   for f in (state / sp).glob("feat_*.safetensors"))
        positions = prog["tokens"] + prog["prompt_tokens"] + prog.get("imported_positions", 0)
        prog.update(tok_per_s=prog["tokens"] / prog["seconds"], dtype=args.dtype, slots=args.slots, split=split,
                    disk_gb=disk / 1e9, disk_gb_per_m_tokens=disk / 1e9 / max(1, positions) * 1e6)
        write_text_atomic(prog_path, json.dumps(prog, indent=1))

    def stop(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)              # `kill` keeps the finished answers of the partial shards
    bar = tqdm(total=len(items), desc="ShareGPT answers", unit="answer", smoothing=0.05)
    try:
        for key, sample in samples:
            split = split_of[key]
            bufs[split].append((key, sample))
            left[split] -= 1
            bar.update()
            if len(bufs[split]) >= args.shard or left[split] == 0:
                save(split)
                if "tok_per_s" in prog:
                    bar.set_postfix(tok_s=f"{prog['tok_per_s']:.0f}")
    except KeyboardInterrupt:
        print("\nstopped: saving the finished answers", flush=True)
    for split in bufs:
        save(split) if bufs[split] else None
    bar.close()
    print(json.dumps(prog), flush=True)


def main(argv=None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    state = Path(args.state).expanduser()
    state.mkdir(parents=True, exist_ok=True)
    if args.export_answers:
        print(f"{export_answers(state, Path(args.export_answers))} answers -> {args.export_answers}")
        return
    prompts = _prompts(args, state, ap)
    native = args.device.startswith("cuda") or cpu_has_native_bf16()
    args.dtype = args.dtype or ("bfloat16" if native else "float32")
    lm = load_model(args.model, dtype=args.dtype, device=args.device)
    if args.export_prompt_ids:
        out = Path(args.export_prompt_ids)
        print(f"{export_prompt_ids(lm, prompts, out, args.val, args.answers, args.max_prompt)} prompts -> {out / PROMPT_IDS}")
        return
    items, samples, split_of = _work(args, lm, prompts, state)
    _collect(args, state, items, samples, split_of)


def split_index(state: Path, split: str) -> list[tuple[int, Path, str, str]]:
    """(list order, shard, index in shard, key) of every sample of a split, in the prompt list's order (only the
    keys are read)."""
    from .sharegpt import list_order
    index = []
    for path in sorted((state / split).glob("feat_*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for b in {k.split(".")[0] for k in f.keys()}:
                index.append((list_order(key := bytes(f.get_tensor(f"{b}.key").tolist()).decode()), path, b, key))
    return sorted(index)


def load_split(state: Path, split: str, limit: int | None = None, max_context: int | None = None) -> list[dict]:
    """Samples of one split, the first `limit` in the prompt list's order (`sharegpt.list_order`: a random
    sample whatever order the job finished them in; the data-scaling curve's prefixes), each with at most
    `max_context` prompt positions before its answer, clipped as it loads (the dropped features are never read)."""
    index = split_index(state, split)
    index = index[:limit] if limit is not None else index
    by_shard: dict[Path, list] = {}
    for it in index:
        by_shard.setdefault(it[1], []).append(it)
    out = []
    for path, items in sorted(by_shard.items()):
        with safe_open(str(path), "pt") as f:
            out += [(order, {**read_sample(f, b, max_context), "key": key}) for order, _, b, key in items]
    return [s for _, s in sorted(out, key=lambda o: o[0])]


if __name__ == "__main__":
    main()
