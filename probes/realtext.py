"""RealText: copy-intent prompts whose material is real text and code instead of template vocabulary.

The CopyDiversity families (probes/copydiversity.py, probes/families.py) draw their material from small word
pools, so every copied span looks alike. Here the material comes from what every Python install carries:
the source of standard-library functions, their docstrings, and the paragraphs of the pydoc topics. The same
three tiers as CopyDiversity: copy intent (reproduce, edit one thing and return the rest, rename, fix typos,
reformat), partial copy (quote a line, bullet points, answer from the text, unit tests, line-by-line
explanations) and accidental repetition only (summaries, explanations, opinions, new code on the same theme).
Instructions come in many phrasings, before or after the material, with several delimiters.

Deterministic for a given seed and Python version (the material is this interpreter's standard library).
"""
from __future__ import annotations

import importlib
import inspect
import random
import re
import textwrap
from functools import lru_cache

from .copydiversity import fill_tiers

R = random.Random
MODULES = ["argparse", "base64", "bisect", "calendar", "colorsys", "configparser", "copy", "csv", "dataclasses",
           "datetime", "difflib", "email.utils", "enum", "fnmatch", "fractions", "functools", "getopt",
           "gettext", "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "inspect", "ipaddress",
           "json", "keyword", "linecache", "locale", "logging", "mimetypes", "netrc", "numbers", "operator",
           "optparse", "os", "pathlib", "platform", "pprint", "queue", "quopri", "random", "reprlib", "sched",
           "secrets", "shlex", "shutil", "stat", "statistics", "string", "struct", "tabnanny", "tarfile",
           "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace", "traceback", "types", "typing",
           "unittest", "urllib.parse", "uuid", "warnings", "wave", "weakref", "xml.dom.minidom", "zipfile"]
TIER_SHARE = {"heavy": 0.25, "medium": 0.25, "light": 0.5}
COPY = ["Copy", "Repeat", "Reproduce", "Echo", "Write out", "Type out", "Transcribe", "Give me back"]
EXACT = ["exactly", "verbatim", "word for word", "without any changes", "as is", "precisely as written"]
FENCES = [("```\n", "\n```"), ("\"\"\"\n", "\n\"\"\""), ("<text>\n", "\n</text>"), ("---\n", "\n---"), ("", "")]
NEW_NAMES = ["process", "handle_item", "compute", "helper", "run_step", "transform", "check_value", "build"]


@lru_cache(maxsize=1)
def material() -> dict[str, list[str]]:
    """{"code": function sources (4-22 lines), "doc": docstrings, "prose": pydoc-topic paragraphs}."""
    # typing_extensions rebinds a few of typing's private functions when imported (transformers imports it): import it
    # first, so the material, and so the prompts of a seed, are the same in every process
    import typing_extensions  # noqa: F401
    code, doc = [], []
    for m in MODULES:
        try:
            mod = importlib.import_module(m)
        except Exception:                                   # a module missing from this build: skip it
            continue
        for name in sorted(vars(mod)):
            fn = vars(mod)[name]
            if not inspect.isfunction(fn) or fn.__module__ != mod.__name__:
                continue
            try:
                src = textwrap.dedent(inspect.getsource(fn))
            except (OSError, TypeError):
                continue
            if 4 <= src.count("\n") <= 22 and len(src) < 900:
                code.append(src.rstrip("\n"))
            d = inspect.getdoc(fn)
            if d and 150 < len(d) < 700:
                doc.append(d)
    from pydoc_data.topics import topics
    prose = []
    for k in sorted(topics):
        for para in topics[k].split("\n\n"):
            p = " ".join(para.split())
            if 200 < len(p) < 650 and p[0].isupper() and p.endswith(".") and not re.search(r"[{}\[\]=]{2}|>>>", p):
                prose.append(p)
    return {"code": code, "doc": doc, "prose": prose}


def _wrap(r: R, text: str) -> str:
    a, b = r.choice(FENCES)
    return f"{a}{text}{b}"


def _place(r: R, instruction: str, text: str) -> str:
    return f"{instruction}\n\n{_wrap(r, text)}" if r.random() < 0.6 else f"{_wrap(r, text)}\n\n{instruction}"


def _fn_name(src: str) -> str:
    return re.match(r"(?:async\s+)?def\s+(\w+)", src.lstrip()).group(1)


def _typos(r: R, text: str, k: int) -> str:
    words = text.split(" ")
    idx = [i for i, w in enumerate(words) if len(w) > 5 and w.isalpha()]
    for i in r.sample(idx, min(k, len(idx))):
        w = words[i]
        j = r.randrange(1, len(w) - 2)
        words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(words)


def _word(r: R, text: str) -> str:
    words = [w.strip(".,;:()") for w in text.split() if len(w.strip(".,;:()")) > 6 and w.isalpha()]
    return r.choice(words) if words else text.split()[0]


def _types():
    """(tier, type name, builder(rng, material) -> prompt)."""
    def code_copy(r, m):
        return _place(r, f"{r.choice(COPY)} this function {r.choice(EXACT)}.", r.choice(m["code"]))

    def code_edit(r, m):
        src = r.choice(m["code"])
        return _place(r, r.choice(["Add a docstring to this function and return the complete function.",
                                   "Add type hints to the signature; keep the body unchanged. Show the full code.",
                                   "Add a comment above the first line of the body and return the whole function.",
                                   f"Rename the function to `{r.choice(NEW_NAMES)}` and show it in full."]), src)

    def prose_copy(r, m):
        return _place(r, f"{r.choice(COPY)} the following {r.choice(['paragraph', 'text', 'passage'])} "
                         f"{r.choice(EXACT)}.", r.choice(m["prose"] + m["doc"]))

    def prose_fix(r, m):
        text = r.choice(m["prose"])
        return _place(r, r.choice(["Fix the spelling mistakes and return the corrected text.",
                                   "There are typos in this paragraph. Rewrite it with them corrected.",
                                   "Correct the misspelled words; change nothing else."]), _typos(r, text, 3))

    def doc_edit(r, m):
        text = r.choice(m["doc"])
        return _place(r, r.choice(["Turn this docstring into Python comments, one # per line, same words.",
                                   "Wrap this text in a Python docstring for a function called `f`.",
                                   "Put this text in a markdown block quote (each line starting with >)."]), text)

    def quote_sentence(r, m):
        text = r.choice(m["prose"])
        w = _word(r, text)
        return _place(r, r.choice([f"Quote the sentence that mentions \"{w}\", then explain it.",
                                   "Quote the first sentence exactly and say what it means.",
                                   f"Which sentence talks about {w}? Quote it."]), text)

    def bullets(r, m):
        return _place(r, r.choice(["Turn this into bullet points.", "Rewrite this as a numbered list of its points.",
                                   "Split this text into short bullet points, one idea each."]),
                      r.choice(m["prose"] + m["doc"]))

    def answer_from_text(r, m):
        text = r.choice(m["prose"])
        return _place(r, f"Using only the text, what does it say about {_word(r, text)}?", text)

    def unit_test(r, m):
        src = r.choice(m["code"])
        return _place(r, r.choice([f"Write a unit test for `{_fn_name(src)}`.",
                                   "Write two pytest tests for this function.",
                                   "Explain this function line by line."]), src)

    def summarize(r, m):
        return _place(r, r.choice(["Summarize this in one sentence.", "Explain this to a beginner.",
                                   "What is the main point here? Answer briefly.", "Give a short summary."]),
                      r.choice(m["prose"] + m["doc"]))

    def code_explain(r, m):
        return _place(r, r.choice(["What does this function do? Answer in two sentences.",
                                   "Describe the purpose of this code in plain English.",
                                   "When would someone call this function?"]), r.choice(m["code"]))

    def code_new(r, m):
        src = r.choice(m["code"])
        return _place(r, r.choice([f"Write a different function, inspired by `{_fn_name(src)}`, that does the "
                                   "opposite.", "Suggest one improvement to this code and explain why.",
                                   "Write a short example that calls this function."]), src)

    def opinion(r, m):
        return _place(r, r.choice(["Do you find this explanation clear? Why or why not?",
                                   "What questions might a student ask after reading this?",
                                   "Write a related example in your own words."]), r.choice(m["prose"]))

    return [("heavy", "rt_code_copy", code_copy), ("heavy", "rt_code_edit", code_edit),
            ("heavy", "rt_prose_copy", prose_copy), ("heavy", "rt_prose_fix", prose_fix),
            ("heavy", "rt_doc_edit", doc_edit),
            ("medium", "rt_quote", quote_sentence), ("medium", "rt_bullets", bullets),
            ("medium", "rt_answer", answer_from_text), ("medium", "rt_unit_test", unit_test),
            ("light", "rt_summarize", summarize), ("light", "rt_code_explain", code_explain),
            ("light", "rt_code_new", code_new), ("light", "rt_opinion", opinion)]


def build(n: int = 640, seed: int = 0, val_fraction: float = 0.2) -> list[dict]:
    """n distinct prompts {"id", "tier", "type", "prompt", "split"}, tiers as TIER_SHARE, shuffled split."""
    r, m = random.Random(seed), material()
    return fill_tiers(r, _types(), TIER_SHARE, n, val_fraction, lambda fn: fn(r, m))
