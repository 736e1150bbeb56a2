"""CopyDiversity-style prompts, written by templates (no external LLM): 17 prompt types in the paper's three
tiers — heavy copy ~10.6%, medium ~11.7%, light/no copy ~77.7% — deterministic from a seed, plus
(`broad=True`, the default) the broadened families of `probes/families.py`: other formats (config files,
CSV, SQL, YAML, e-mail, code fixes and renames) and phrasings of copy intent, and more kinds of accidental
repetition (equations, comparisons, explanations, how-tos).

Accidental repetition is included on purpose (math with recurring variable names, lists, repeated words), so a
probe must learn the model's intent to copy, not surface overlap.
"""
from __future__ import annotations

import json
import random

WORDS = ["river", "lantern", "orbit", "maple", "signal", "harbor", "pixel", "meadow", "copper", "violet", "canyon",
         "ember", "glacier", "thistle", "quartz", "falcon", "willow", "saffron", "tundra", "cobalt"]
NAMES = ["Alice", "Bruno", "Chen", "Divya", "Emeka", "Fatima", "Goran", "Hiro", "Ines", "Jonas", "Kaia", "Luca",
         "Mei", "Nadia", "Oscar", "Paula", "Ravi", "Sofia", "Tomas", "Yara"]
CITIES = ["Lyon", "Osaka", "Quito", "Perth", "Tallinn", "Accra", "Porto", "Hanoi", "Bergen", "Cusco"]
TOPICS = ["tides", "volcanoes", "bees", "glaciers", "lighthouses", "comets", "coral reefs", "deserts", "owls",
          "bridges", "trains", "kites", "maps", "clocks", "caves", "rainbows", "windmills", "forests"]
QUOTES = ["The only way out is through.", "Simplicity is the soul of efficiency.", "Measure twice, cut once.",
          "Well begun is half done.", "Fortune favors the prepared mind.", "Knowledge speaks, wisdom listens.",
          "Every expert was once a beginner.", "Small steps lead to big changes."]
TERMS = {"photosynthesis": "the process by which plants turn light, water and carbon dioxide into sugar and oxygen",
         "inflation": "a general rise in prices that reduces the purchasing power of money",
         "osmosis": "the movement of water across a membrane from low to high solute concentration",
         "metaphor": "a figure of speech that describes something as if it were something else",
         "latency": "the delay between a request and the start of its response",
         "erosion": "the wearing away of land by wind, water or ice",
         "algorithm": "a finite sequence of precise steps that solves a problem",
         "democracy": "a system of government in which citizens choose their leaders by voting"}


def _json_obj(r: random.Random) -> str:
    obj = {"id": r.randint(100, 9999), "name": r.choice(NAMES), "city": r.choice(CITIES),
           "tags": r.sample(WORDS, 3), "active": r.choice([True, False]), "score": round(r.uniform(0, 100), 1)}
    return json.dumps(obj)


def _code(r: random.Random) -> str:
    fn = r.choice(["total", "average", "count_items", "scale", "combine", "tally", "accumulate", "measure"])
    var, acc = r.choice(["values", "items", "data", "numbers", "scores"]), r.choice(["result", "acc", "out", "s"])
    k = r.randint(1, 9)
    return (f"def {fn}({var}):\n    {acc} = 0\n    for x in {var}:\n        {acc} += x * {k}\n"
            f"    return {acc}\n")


# (tier, type name, builder)
def _types():
    return [
        ("heavy", "json_echo", lambda r: f"Repeat this JSON exactly, then stop:\n{_json_obj(r)}"),
        ("heavy", "quote_extraction", lambda r: (
            f"Here is a passage: \"{r.choice(NAMES)} once said: '{r.choice(QUOTES)}' Later, in {r.choice(CITIES)}, "
            f"the team adopted it as a motto.\" Copy the quoted sentence exactly.")),
        ("heavy", "code_boilerplate", lambda r: (
            f"Here is a Python function:\n```python\n{_code(r)}```\nRewrite it exactly, adding a docstring.")),
        ("heavy", "template_filling", lambda r: (
            f"Fill this template for {r.choice(NAMES)} from {r.choice(CITIES)} and keep every other word "
            f"unchanged: 'Dear NAME, thank you for visiting CITY. We hope to see you again in CITY soon.'")),
        ("heavy", "list_repeat", lambda r: (
            "Repeat this list in the same order: " + ", ".join(r.sample(WORDS, 8)) + ".")),
        ("medium", "definition_recall", lambda r: (lambda t: (
            "Definitions: " + " ".join(f"{k}: {v}." for k, v in r.sample(list(TERMS.items()), 3)) +
            f" Using the definitions above, what is {t}? Then give an example."))(r.choice(list(TERMS)))),
        ("medium", "summarize_and_quote", lambda r: (
            f"Article: {r.choice(NAMES)} opened a small bakery in {r.choice(CITIES)}. '{r.choice(QUOTES)}' "
            f"they told reporters. The bakery sells bread made with {r.choice(WORDS)} flour. Summarize the article "
            f"in two sentences and include the quote.")),
        ("medium", "qa_from_passage", lambda r: (
            f"Passage: The {r.choice(WORDS)} festival in {r.choice(CITIES)} takes place every spring and attracts "
            f"{r.randint(2, 90)} thousand visitors who come to see the {r.choice(TOPICS)}. Question: where and when "
            f"does the festival take place? Answer using the passage.")),
        ("medium", "translate_names", lambda r: (
            f"Rewrite this sentence in the past tense, keeping the names: '{r.choice(NAMES)} and {r.choice(NAMES)} "
            f"walk to the {r.choice(WORDS)} market in {r.choice(CITIES)}.'")),
        ("light", "creative_writing", lambda r: (
            f"Write a short story about {r.choice(NAMES)}, {r.choice(TOPICS)} and a {r.choice(WORDS)}.")),
        ("light", "poem", lambda r: f"Write a {r.choice(['short', 'rhyming', 'funny', 'sad', 'hopeful'])} poem "
                                    f"about {r.choice(TOPICS)} in {r.choice(CITIES)}."),
        ("light", "open_question", lambda r: (
            f"Why are {r.choice(TOPICS)} important for people in {r.choice(CITIES)}? Explain.")),
        ("light", "reasoning_puzzle", lambda r: (
            f"A patch of lily pads doubles in size every day. It covers the lake in {r.randint(10, 60)} days. "
            f"On which day did it cover half the lake? Explain your reasoning.")),
        ("light", "math_variables", lambda r: (lambda n: (
            f"Let {n} be an integer. Show that {n}^2 + {n} is even by considering {n} = 2k and {n} = 2k + 1, "
            f"and compute the value for {n} = {r.randint(2, 20)}."))(r.choice(["n", "x", "m", "k"]))),
        ("light", "word_problem", lambda r: (
            f"{r.choice(NAMES)} buys {r.randint(2, 9)} apples at {r.randint(1, 5)} dollars each and "
            f"{r.randint(2, 9)} pears at {r.randint(1, 5)} dollars each. How much does {r.choice(NAMES)} spend? "
            "Show each step.")),
        ("light", "advice", lambda r: (
            f"Give {r.choice(NAMES)} {r.randint(3, 7)} tips for learning about {r.choice(TOPICS)} as a beginner.")),
        ("light", "listing", lambda r: (
            f"List {r.randint(5, 12)} facts about {r.choice(TOPICS)} and {r.choice(TOPICS)}, one per line.")),
    ]


TIER_SHARE = {"heavy": 0.106, "medium": 0.117, "light": 0.777}


def build(n: int = 1000, seed: int = 0, val_fraction: float = 0.2, broad: bool = True) -> list[dict]:
    """n prompts {"id", "tier", "type", "prompt", "split"}; tier shares as in the paper; shuffled split.
    `broad=False`: the original 17 types only."""
    r = random.Random(seed)
    types = _types()
    if broad:
        from .families import broad_types
        types = types + broad_types()
    return fill_tiers(r, types, TIER_SHARE, n, val_fraction, lambda fn: fn(r))


def fill_tiers(r: random.Random, types: list, shares: dict[str, float], n: int, val_fraction: float,
               call) -> list[dict]:
    """n distinct prompts, tiers in `shares`, types of a tier in turn (`call(builder)` writes one); shuffled,
    ids 0..n-1, the first val_fraction of them "val"."""
    by_tier = {t: [x for x in types if x[0] == t] for t in shares}
    counts = {t: round(n * s) for t, s in shares.items()}
    counts["light"] += n - sum(counts.values())
    rows, seen = [], set()
    for tier, k in counts.items():
        made, tries = 0, 0
        while made < k:
            _, name, fn = by_tier[tier][(made + tries) % len(by_tier[tier])]
            p = call(fn)
            if p in seen:  # a duplicate: move on to the next type of the tier
                tries += 1
                if tries > 100 * k:
                    raise RuntimeError(f"cannot build {k} distinct {tier} prompts")
                continue
            seen.add(p)
            rows.append({"tier": tier, "type": name, "prompt": p})
            made += 1
    r.shuffle(rows)
    n_val = round(n * val_fraction)
    for i, row in enumerate(rows):
        row["id"] = i
        row["split"] = "val" if i < n_val else "train"
    return rows


def held_out(n: int, seed: int, train_n: int = 1200, train_seed: int = 0, broad: bool = True) -> list[dict]:
    """n fresh prompts of the same types (another seed), none of which is in the training set build(train_n,
    train_seed): a held-out set of the probe's own family."""
    seen = {r["prompt"] for r in build(train_n, train_seed, broad=broad)}
    rows = [r for r in build(2 * n + 40, seed, broad=broad) if r["prompt"] not in seen][:n]
    if len(rows) < n:
        raise RuntimeError(f"only {len(rows)} fresh prompts for seed {seed}")
    return rows


def main(argv=None) -> None:
    """Write a held-out CopyDiversity set as JSONL rows {"id", "tier", "type", "prompt"} for probes.evaluate."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--train-n", type=int, default=1200, help="the training set to exclude (probes.collect --n)")
    ap.add_argument("--train-seed", type=int, default=0, help="its seed (probes.collect --seed)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = held_out(args.n, args.seed, args.train_n, args.train_seed)
    with open(args.out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({k: r[k] for k in ("id", "tier", "type", "prompt")}) + "\n")
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
