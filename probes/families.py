"""Broadened CopyDiversity families: more formats and phrasings of copy intent, more kinds of accidental
repetition. Each builder takes a `random.Random` and returns one user prompt; phrasings, formats and the
position of the instruction (before or after the material) are drawn, so no single wording dominates.

Copy intent (heavy / medium): edit one value of a config / YAML / JSON and return the rest unchanged, fix a
bug and return the whole function, rename an identifier everywhere, reproduce text under many phrasings,
reformat CSV or comma lists, extend an SQL query, reply to an e-mail quoting it, quote a given line and discuss
it. Accidental repetition (light): equations solved step by step (the variable recurs), comparisons of two
things (both names recur), explanations, how-tos and descriptions of a role.
"""
from __future__ import annotations

import json
import random

R = random.Random
FIRST = ["Ana", "Bilal", "Carmen", "Dmitri", "Elif", "Femi", "Greta", "Hamid", "Isla", "Jun", "Kofi", "Lena",
         "Malik", "Noor", "Olga", "Pedro", "Rosa", "Sami", "Tara", "Viktor"]
PLACES = ["Zurich", "Mombasa", "Valparaiso", "Krakow", "Nagoya", "Adelaide", "Tbilisi", "Seville", "Halifax",
          "Bruges", "Medellin", "Trondheim"]
NOUNS = ["garden", "harbour", "library", "bicycle", "kettle", "violin", "compass", "notebook", "ladder",
         "umbrella", "telescope", "bakery", "museum", "tram", "orchard", "workshop"]
ADJS = ["quiet", "bright", "narrow", "ancient", "busy", "gentle", "crooked", "silver", "windy", "tiny"]
VERBS = ["painted", "repaired", "visited", "measured", "described", "photographed", "cleaned", "mapped"]
FRUIT = ["figs", "limes", "dates", "quinces", "mangoes", "guavas", "kiwis", "lychees", "grapes", "melons"]
JOBS = ["beekeeper", "ferry captain", "museum guide", "night baker", "park ranger", "sound engineer",
        "glassblower", "air-traffic controller", "librarian", "mountain guide", "translator", "vet"]
PAIRS = [("a comet", "an asteroid"), ("weather", "climate"), ("a lake", "a pond"), ("speed", "velocity"),
         ("a stock", "a bond"), ("RAM", "disk storage"), ("a simile", "a metaphor"), ("a frog", "a toad"),
         ("an alligator", "a crocodile"), ("mass", "weight"), ("a cold", "the flu"), ("HTTP", "HTTPS")]
WHYS = ["do leaves change colour in autumn", "does bread rise", "do we have seasons", "is the sea salty",
        "do cats purr", "does ice float", "do onions make people cry", "do planes leave contrails",
        "is sleep important", "do bubbles look round", "does metal feel cold", "do stars twinkle"]
TASKS = ["keeping a houseplant alive", "learning to juggle", "writing a clear e-mail", "saving money on food",
         "running a first 5k", "making a budget", "sleeping better", "giving a short talk", "learning chess"]
COPY_VERBS = ["Copy", "Repeat", "Reproduce", "Echo back", "Write out", "Restate", "Transcribe"]
EXACTLY = ["exactly", "verbatim", "word for word", "character for character", "without changing anything",
           "as it is", "unchanged"]


def _sentence(r: R) -> str:
    return (f"The {r.choice(ADJS)} {r.choice(NOUNS)} in {r.choice(PLACES)} was {r.choice(VERBS)} by "
            f"{r.choice(FIRST)} {r.choice(['last spring', 'on a Tuesday', 'before dawn', 'in 1987', 'twice'])}.")


def _place(r: R, instruction: str, material: str) -> str:
    """The instruction before or after the material."""
    return f"{instruction}\n\n{material}" if r.random() < 0.6 else f"{material}\n\n{instruction}"


def _config(r: R) -> tuple[str, str, str]:
    keys = r.sample(["host", "port", "user", "timeout", "retries", "log_level", "cache_dir", "workers",
                     "region", "mode"], 5)
    vals = {"host": f"{r.choice(NOUNS)}.{r.choice(['local', 'internal', 'example.org'])}",
            "port": str(r.randint(1024, 9999)), "user": r.choice(FIRST).lower(), "timeout": str(r.randint(5, 90)),
            "retries": str(r.randint(1, 7)), "log_level": r.choice(["info", "debug", "warn"]),
            "cache_dir": f"/var/cache/{r.choice(NOUNS)}", "workers": str(r.randint(2, 32)),
            "region": r.choice(["eu-west", "us-east", "ap-south"]), "mode": r.choice(["fast", "safe", "batch"])}
    style = r.choice(["ini", "yaml", "env"])
    sep = {"ini": " = ", "yaml": ": ", "env": "="}[style]
    text = "\n".join(f"{k.upper() if style == 'env' else k}{sep}{vals[k]}" for k in keys)
    k = r.choice(keys)
    return text, (k.upper() if style == "env" else k), style


def _function(r: R) -> tuple[str, str, str]:
    name = r.choice(["mean_of", "clamp", "word_count", "first_even", "to_celsius", "max_gap", "is_sorted"])
    arg, tmp = r.choice(["xs", "values", "nums", "items"]), r.choice(["total", "acc", "best", "count"])
    body = (f"def {name}({arg}):\n    {tmp} = 0\n    for x in {arg}:\n        if x > {tmp}:\n"
            f"            {tmp} = x\n    return {tmp}\n")
    return body, arg, tmp


def broad_types():
    """(tier, type name, builder) for the broadened families."""
    def config_edit(r):
        text, k, style = _config(r)
        new = r.choice(["42", "off", "verbose", "0.0.0.0", "backup", "12"])
        return _place(r, r.choice([f"Change {k} to {new} and return the full file with everything else unchanged.",
                                   f"Set {k} to {new}. Show the whole {style} config again.",
                                   f"Update only the {k} value to {new}; keep every other line as it is."]),
                      f"```\n{text}\n```")

    def code_fix(r):
        body, arg, tmp = _function(r)
        typo = body.replace(f"return {tmp}", f"retrun {tmp}") if r.random() < 0.5 else \
            body.replace(f"in {arg}:", f"in {arg[:-1]}:")
        return _place(r, r.choice(["Fix the bug and give me the complete corrected function.",
                                   "There is one mistake in this code. Return the whole function, fixed.",
                                   "Correct the error; show the full code."]), f"```python\n{typo}```")

    def code_rename(r):
        body, arg, tmp = _function(r)
        new = r.choice(["result", "running", "peak", "current"])
        return _place(r, f"Rename the variable `{tmp}` to `{new}` everywhere and show the full function.",
                      f"```python\n{body}```")

    def verbatim(r):
        text = " ".join(_sentence(r) for _ in range(r.randint(1, 3)))
        return _place(r, f"{r.choice(COPY_VERBS)} the following {r.choice(['text', 'sentence', 'lines'])} "
                         f"{r.choice(EXACTLY)}.", text)

    def json_edit(r):
        obj = {"name": r.choice(FIRST), "city": r.choice(PLACES), "items": r.sample(FRUIT, 3),
               "count": r.randint(1, 500), "verified": r.choice([True, False])}
        field, val = r.choice([("country", "unknown"), ("rating", 4.5), ("note", "checked")])
        return _place(r, r.choice([f"Add a field \"{field}\" with value {json.dumps(val)} and return the JSON.",
                                   "Return this JSON unchanged.", "Pretty-print this JSON without changing values."]),
                      json.dumps(obj))

    def csv_reformat(r):
        rows = [f"{r.choice(FIRST)},{r.choice(PLACES)},{r.randint(18, 80)}" for _ in range(r.randint(3, 5))]
        return _place(r, r.choice(["Convert this CSV to a markdown table.", "Return the CSV with the rows in "
                                   "the same order and a header line name,city,age.", "Turn each row into a "
                                   "sentence of the form 'NAME lives in CITY and is AGE.'"]), "\n".join(rows))

    def list_reformat(r):
        items = r.sample(FRUIT + NOUNS, r.randint(5, 8))
        return _place(r, r.choice(["Turn this into a numbered list, same order.", "Write these as bullet points.",
                                   "Sort these alphabetically and list them one per line."]), ", ".join(items))

    def sql_extend(r):
        t = r.choice(["orders", "users", "trips", "books"])
        q = f"SELECT id, {r.choice(['name', 'title', 'city'])}, created_at FROM {t} WHERE status = 'open'"
        return _place(r, r.choice(["Add ORDER BY created_at DESC and return the full query.",
                                   "Add a LIMIT 10 and give me the whole query back."]), q)

    def email_reply(r):
        who, thing = r.choice(FIRST), r.choice(NOUNS)
        mail = (f"Hi, my {thing} order #{r.randint(1000, 9999)} arrived damaged. Can I get a replacement "
                f"before {r.choice(['Friday', 'the weekend', 'May 3'])}? Thanks, {who}")
        return _place(r, "Reply politely to this e-mail. Start by quoting the customer's question.", mail)

    def quote_line(r):
        lines = [_sentence(r) for _ in range(4)]
        k = r.choice(["first", "second", "last"])
        return ("Here are four lines:\n" + "\n".join(lines) +
                f"\nQuote the {k} line exactly, then say what it describes.")

    def equation(r):
        v = r.choice(["x", "y", "n", "t"])
        a, b = r.randint(2, 9), r.randint(1, 30)
        return f"Solve: {a}{v} + {b} = {a * r.randint(1, 12) + b}. Show your steps."

    def compare(r):
        a, b = r.choice(PAIRS)
        return r.choice([f"What is the difference between {a} and {b}?", f"Compare {a} and {b} briefly.",
                         f"How is {a} different from {b}?"])

    def why(r):
        return r.choice([f"Why {r.choice(WHYS)}? Explain briefly.", f"Explain in simple terms why {r.choice(WHYS)}."])

    def howto(r):
        return r.choice([f"Give {r.randint(3, 6)} tips for {r.choice(TASKS)}.",
                         f"How do I get started with {r.choice(TASKS)}?"])

    def role_day(r):
        return r.choice([f"Describe a day in the life of a {r.choice(JOBS)}.",
                         f"What does a {r.choice(JOBS)} do all day? Write a short description."])

    return [
        ("heavy", "config_edit", config_edit), ("heavy", "code_fix", code_fix),
        ("heavy", "code_rename", code_rename), ("heavy", "verbatim", verbatim), ("heavy", "json_edit", json_edit),
        ("medium", "csv_reformat", csv_reformat), ("medium", "list_reformat", list_reformat),
        ("medium", "sql_extend", sql_extend), ("medium", "email_reply", email_reply),
        ("medium", "quote_line", quote_line),
        ("light", "equation", equation), ("light", "compare", compare), ("light", "why", why),
        ("light", "howto", howto), ("light", "role_day", role_day),
    ]
