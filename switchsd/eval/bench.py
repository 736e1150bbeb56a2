"""Side-by-side benchmark: every method on the same prompts, in one process, after a warm-up.

    python -m switchsd bench --dataset humaneval --limit 10 --methods vanilla,pld,copyspec,copy \
        --max-new-tokens 128 --out runs/humaneval

Methods run prompt by prompt, interleaved (so slow drifts of the machine hit all methods alike). Besides ours
(`switchsd.methods.METHODS`, with variants), the peers a transformers user already has: `hf` (the model's own
`generate`), `hf-pld` (`generate(prompt_lookup_num_tokens=10)`) and, with --draft, `hf-assisted`; llama.cpp's
own server on the same GGUF (`make llama-cpp`): `llama-cpp`, `llama-cpp-ngram`, `llama-cpp-eagle3`,
`llama-cpp-hybrid` (switchsd.eval.llama_server).
Reported per method: Tok/s as the mean of per-prompt rates (Spec-Bench) and as total tokens / total time,
speedup = mean Tok/s over vanilla's, tokens per target forward (bonus included), per path % of
iterations and MAL (accepted draft tokens per step), and how many outputs are identical to vanilla.
Writes results.json, table.md and record.json.gz (the self-describing record `switchsd report` reads) to --out;
the LAST printed line is a one-line JSON summary.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..cli.common import (
    Neural,
    add_decode_args,
    add_model_args,
    add_neural_args,
    build_engine,
    copy_config,
    engine_config,
    load,
    load_prompt_file,
    resolve_budget,
)
from ..core.policies import Fixed
from ..drafters.oracle import OracleDrafter
from ..factory import make_engine, shipped_for
from ..io import write_text_atomic
from ..methods import METHODS
from ..models.loading import DEFAULT_MODEL, ModelLoadError, default_model_folder, gguf_model, gguf_path, load_model
from . import llama_server
from .datasets import DATASETS
from .llama_server import SERVER_PEERS, LlamaServerPeer
from .mismatch import explain, summarize_mismatches
from .peers import HF_PEERS, HFPeer
from .records import aggregate, commit, write_record

PEERS = HF_PEERS + SERVER_PEERS


def _mismatches(args, lm, prompts: dict, records: dict, vanilla_ids: dict) -> list[dict]:
    """Explain every output that differs from vanilla (see switchsd.eval.mismatch); float32 re-scoring."""
    bad = [(m, r) for m, rs in records.items() if m != "vanilla" for r in rs if r["token_ids"] != vanilla_ids[r["id"]]]
    if not bad:
        return []
    ref = lm.model if lm.dtype == torch.float32 else load_model(args.model, "float32", str(lm.device)).model
    out = []
    for m, r in tqdm(bad, desc="explaining mismatches", file=sys.stderr):
        x = explain(ref, prompts[r["id"]], vanilla_ids[r["id"]], r["token_ids"])
        out.append({"method": m, "id": r["id"], **x})
    return out


def _resume(path: Path, key: dict, fresh: bool) -> list[dict]:
    """Finished prompts of an interrupted run with the same settings (first line of the file = its key). A last
    line cut by a kill is dropped (that prompt runs again); any other bad line stops the run with its number."""
    if fresh or not path.exists():
        path.write_text(json.dumps({"key": key}) + "\n")
        return []
    raw = path.read_text().splitlines()
    lines = []
    for i, x in enumerate(raw, 1):
        try:
            row = json.loads(x)
        except json.JSONDecodeError:
            row = None
        good = isinstance(row, dict) and ("key" in row if i == 1 else (
            "id" in row and isinstance(row.get("records"), dict)))
        if not good:
            if i == len(raw) and i > 1:      # a line cut by a kill
                print(f"{path}:{i}: incomplete last line dropped; that prompt runs again", file=sys.stderr)
                break
            raise SystemExit(f"error: {path}:{i}: not a line this benchmark wrote; pass --fresh to discard the "
                             "partial run or choose another --out")
        lines.append(row)
    if lines[0].get("key") != json.loads(json.dumps(key)):
        raise SystemExit(f"error: {path} holds a run with other settings; pass --fresh to discard it "
                         "or choose another --out")
    ids = [x["id"] for x in lines[1:]]
    if ids != key["prompts"][:len(ids)]:
        raise SystemExit(f"error: {path}: its prompts are not the first {len(ids)} of this run's, in order; "
                         "pass --fresh")
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))   # drop a cut last line, if any
    print(f"resuming: {len(lines) - 1} prompt(s) already done in {path}", file=sys.stderr)
    return lines[1:]


def table(summary: dict) -> str:
    orc = any("of_oracle" in s for s in summary.values())
    rows = ["| method | Tok/s (mean) | Tok/s (total) | speedup |" + (" of oracle |" if orc else "") +
            " tok/fwd | paths: % iters / MAL | identical |",
            "|---|---|---|---|" + ("---|" if orc else "") + "---|---|---|"]
    for m, s in summary.items():
        paths = ", ".join(f"{k} {v['pct']:.1f}% / {v['mal']:.2f}" for k, v in s["paths"].items())
        rows.append(f"| {m} | {s['tok_s']:.2f} | {s['tok_s_total']:.2f} | {s['speedup']:.2f}x |" +
                    (f" {100 * s.get('of_oracle', 0):.0f}% |" if orc else "") +
                    f" {s['tok_per_fwd']:.2f} | {paths} | {s['identical']}/{s['n']} |")
    return "\n".join(rows)


def parse(argv=None) -> tuple[argparse.Namespace, list[str], list[dict]]:
    """The command line -> (args, methods with vanilla first, prompts); `error: ...` for anything malformed."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True, choices=DATASETS)
    ap.add_argument("--data-file", default=None, help="JSONL file (required for --dataset jsonl)")
    ap.add_argument("--category", default=None, help="specbench / mtbench: keep these categories (comma-separated, e.g. writing,roleplay)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--methods", default="hf,hf-pld,vanilla,pld,copyspec,eagle3,switchsd,switchsd-paper",
                    help=f"comma-separated: {', '.join(METHODS)} (variants NAME@chainG, NAME@treeKxDxN, +kN, +tX), "
                         f"oracle, and the peers {', '.join(PEERS)}")
    ap.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up generations per method before timing")
    ap.add_argument("--out", default="runs/bench")
    ap.add_argument("--record", default=None,
                    help="where to write the run's record (default: OUT/record.json.gz; the committed ones: "
                         "docs/records/)")
    ap.add_argument("--fresh", action="store_true",
                    help="discard a partial run in --out (default: resume it, prompt by prompt)")
    add_model_args(ap)
    add_decode_args(ap)
    add_neural_args(ap)
    args = ap.parse_args(argv)
    args.command = "python -m switchsd bench " + " ".join(argv if argv is not None else sys.argv[1:])
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if re.split(r"[@+]", m, maxsplit=1)[0] not in METHODS and m != "oracle"
           and m not in PEERS]
    if bad or not methods:
        ap.error(f"unknown method(s) {bad}; choose from {', '.join(METHODS + PEERS)}, oracle")
    if "hf-assisted" in methods and not args.draft:
        ap.error("hf-assisted needs --draft MODEL (a small model sharing the tokenizer)")
    # vanilla first: the reference for identity, speedup and the oracle's continuation
    methods = ["vanilla"] + [m for m in dict.fromkeys(methods) if m != "vanilla"]
    return args, methods, load_prompt_file(args, args.limit, args.category)


@dataclass
class BenchRun:
    """What `run` measured: per method, one record per prompt (token ids and stats), and vanilla's tokens."""
    lm: object
    methods: list[str]
    encoded: list[tuple]
    records: dict[str, list[dict]]
    vanilla_ids: dict
    meta: dict


def run(args: argparse.Namespace, methods: list[str], prompts: list[dict]) -> BenchRun:
    """Every method on every prompt, interleaved prompt by prompt after a warm-up, resumable from
    `--out`/partial.jsonl."""
    started = commit()          # the code that runs: the checkout as it is now, not when the record is written
    lm = load(args)
    budget, source = resolve_budget(args, lm)
    cfg = engine_config(args, budget)
    copy_cfg = copy_config(args)
    chat = not args.no_chat and bool(getattr(lm.tokenizer, "chat_template", None))
    encoded = [(p["id"], lm.encode(p["prompt"], chat=chat)) for p in prompts]
    too_long = [pid for pid, ids in encoded if len(ids) + 1 >= lm.max_length]
    if too_long:
        raise SystemExit(f"error: prompts longer than the model's context ({lm.max_length}): {too_long[:5]}")
    neural = Neural(args, lm)
    eos = lm.eos_ids()

    head_gguf = None
    for peer in [m for m in methods if m in SERVER_PEERS]:
        why = llama_server.missing() or (None if gguf_model(args.model) else
                                         "it needs a GGUF model (the offline default or a .gguf file)")
        if why is None and cfg.sampling.temperature > 0:
            why = "greedy only (T = 0)"
        if why is None and peer in llama_server.NEEDS_HEAD and head_gguf is None:
            head = Path(args.eagle) if args.eagle != "auto" else shipped_for(lm, "eagle3")
            try:
                if head is None or not (head / "model.safetensors").exists():
                    raise RuntimeError(f"no EAGLE-3 head folder for {lm.name} (--eagle DIR)")
                head_gguf = llama_server.eagle3_gguf(head, default_model_folder() if args.eagle == "auto" or args.model
                                                     in (None, DEFAULT_MODEL) else Path(args.model).parent)
            except (RuntimeError, OSError) as e:
                why = str(e).splitlines()[0]
        if why:
            print(f"{peer} skipped: {why}", file=sys.stderr)
            methods.remove(peer)

    def make(m: str, cfg):
        if m in SERVER_PEERS:
            return LlamaServerPeer(m, gguf_path(args.model), cfg, eos, head_gguf, log=Path(args.out) / f"{m}.log")
        if m in PEERS:
            return HFPeer(m, lm.model, cfg, eos, neural.drafters.draft_model if m == "hf-assisted" else None)
        return build_engine(m, lm, cfg, copy_cfg, neural)

    Path(args.out).mkdir(parents=True, exist_ok=True)
    engines = {m: make(m, cfg) for m in methods if m != "oracle"}
    oracle = lambda ref: make_engine(lm.model, Fixed([OracleDrafter(ref)]), cfg, eos, lm.max_length)
    # Warm-up: every method once on the first prompt (not timed, not recorded).
    for m in methods:
        if m == "oracle":
            continue
        if m in SERVER_PEERS:        # a server warms up on the first prompt itself (its own process, one start)
            for _ in range(args.warmup):
                engines[m].run(encoded[0][1], torch.Generator().manual_seed(0))
            continue
        warm = make(m, engine_config(argparse.Namespace(**{**vars(args), "max_new_tokens": 16}), budget))
        for _ in range(args.warmup):
            warm.run(encoded[0][1], torch.Generator().manual_seed(0))
        warm.close()
    records: dict[str, list[dict]] = {m: [] for m in methods}
    vanilla_ids: dict = {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Checkpoint: one JSON line per finished prompt, so a long run resumes where it stopped.
    n_cfg, g_cfg = neural.configs()
    key = {"dataset": args.dataset, "methods": methods, "prompts": [pid for pid, _ in encoded], "model": lm.name,
           "chat": chat, "dtype": lm.precision, "budget": budget, "engine": asdict(cfg), "copy": asdict(copy_cfg),
           "neural": asdict(n_cfg), "gate": asdict(g_cfg), "eagle": args.eagle, "probe": args.probe,
           "draft": args.draft, "fallback": args.neural, "seed": 0, "commit": started["sha"],
           # the prompts' token ids, so an edited --data-file with the same ids is not merged
           "prompt_sha": hashlib.sha256(json.dumps(encoded).encode()).hexdigest()[:16]}
    done = _resume(out / "partial.jsonl", key, args.fresh)
    for line in done:
        vanilla_ids[line["id"]] = line["records"]["vanilla"]["token_ids"]
        for m in methods:
            records[m].append(line["records"][m])
    bar = tqdm(total=len(encoded) * len(methods), initial=len(done) * len(methods), desc=f"bench {args.dataset}",
               unit="gen", file=sys.stderr)
    for pid, ids in encoded[len(done):]:
        row = {}
        for m in methods:
            eng = oracle(ids + vanilla_ids[pid]) if m == "oracle" else engines[m]
            res = eng.run(ids, torch.Generator().manual_seed(0))
            if m == "vanilla":
                vanilla_ids[pid] = res.token_ids
            row[m] = {"id": pid, "prompt_tokens": len(ids), "token_ids": res.token_ids, "stats": res.stats}
            records[m].append(row[m])
            bar.set_postfix(method=m, tok_s=f"{res.stats['tok_s']:.1f}")
            bar.update()
        with open(out / "partial.jsonl", "a") as f:
            f.write(json.dumps({"id": pid, "records": row}) + "\n")
    bar.close()
    for m in methods:
        if m in SERVER_PEERS:
            engines[m].close()
    meta = {"dataset": args.dataset, "n_prompts": len(encoded), "methods": methods, "model": lm.name,
            "device": str(lm.device), "dtype": lm.precision, "chat": chat, "budget": budget,
            "budget_source": source, "engine": asdict(cfg), "copy": asdict(copy_cfg),
            "torch": torch.__version__, "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": args.command, "commit": started,
            "max_new_tokens": cfg.max_new_tokens, "eagle": args.eagle, "probe": args.probe,
            "head_path": str(shipped_for(lm, "eagle3") or "") if args.eagle == "auto" else args.eagle,
            "probe_path": str(shipped_for(lm, "probe") or "") if args.probe == "auto" else args.probe,
            "llama_cpp": llama_server.version() if any(m in SERVER_PEERS for m in methods) else None,
            "head_gguf": str(head_gguf) if head_gguf else None,
            "llama_cpp_amx": llama_server.amx_note() if any(m in SERVER_PEERS for m in methods) else None}
    return BenchRun(lm, methods, encoded, records, vanilla_ids, meta)


def report(args: argparse.Namespace, r: BenchRun) -> None:
    """results.json (then the near-ties explained in float32), table.md, the table and a JSON line on stdout."""
    out, methods, records = Path(args.out), r.methods, r.records
    summary = {m: aggregate(records[m], r.vanilla_ids) for m in methods}
    base = summary["vanilla"]["tok_s"]
    for s in summary.values():
        s["speedup"] = s["tok_s"] / base if base else 0.0
    if "oracle" in summary:
        for s in summary.values():
            s["of_oracle"] = s["speedup"] / summary["oracle"]["speedup"] if summary["oracle"]["speedup"] else 0.0
    # results first: the optional float32 re-scoring below may load a second copy of the target (and fail)
    write_text_atomic(out / "results.json", json.dumps({"meta": r.meta, "summary": summary, "mismatches": None,
                                                        "records": records}, indent=1))
    try:
        mismatches = _mismatches(args, r.lm, dict(r.encoded), records, r.vanilla_ids)
    except (RuntimeError, MemoryError, ModelLoadError) as e:      # e.g. out of memory: the results stand
        print(f"mismatch explanations skipped ({e.__class__.__name__}: {str(e)[:200]})", file=sys.stderr)
        mismatches = None
    if mismatches is not None:
        write_text_atomic(out / "results.json", json.dumps({"meta": r.meta, "summary": summary,
                                                            "mismatches": mismatches, "records": records}, indent=1))
    texts = {m: {x["id"]: r.lm.tokenizer.decode(x["token_ids"]) for x in records[m]} for m in methods}
    path = write_record(Path(args.record) if args.record else out / "record.json.gz", meta=r.meta,
                        methods=methods, records=records, texts=texts, mismatches=mismatches)
    print(f"record: {path} (switchsd report builds the results pages from records)", file=sys.stderr)
    md = table(summary)
    m = r.meta
    (out / "table.md").write_text(f"{args.dataset}, {len(r.encoded)} prompts, {m['model']} on {m['device']} "
                                  f"({r.lm.precision}), budget {m['budget']}, max_new_tokens "
                                  f"{m['engine']['max_new_tokens']}, T={m['engine']['sampling']['temperature']}"
                                  f"\n\n{md}\n\n{summarize_mismatches(mismatches)}\n")
    print(md)
    print(json.dumps({"methods": {m: {"tok_s": round(s["tok_s"], 3), "speedup": round(s["speedup"], 3),
                                      "tok_per_fwd": round(s["tok_per_fwd"], 3), "identical": s["identical"], "n": s["n"],
                                      **({"of_oracle": round(s["of_oracle"], 3)} if "of_oracle" in s else {}),
                                      "paths": {k: {"pct": round(v["pct"], 2), "mal": round(v["mal"], 3)}
                                                for k, v in s["paths"].items()}}
                                  for m, s in summary.items()}}))


def main(argv=None) -> None:
    args, methods, prompts = parse(argv)
    report(args, run(args, methods, prompts))


if __name__ == "__main__":
    main()
