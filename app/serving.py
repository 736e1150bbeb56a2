"""Serving view: a small request load under batched SD (the draft model drafting between verify steps) and
MineDraft's PSD (the drafter in its own process, drafting one sub-batch while the target verifies the other),
drawn as it runs: a timeline of who was busy when, generated tokens over time, and each request's latency.
"""
from __future__ import annotations

import html
import time
from typing import Iterator

from switchsd.core.config import EngineConfig
from switchsd.serve.load import Req, arrivals, iter_mode

from .plots import AXIS, Figure, plot_value
from .resources import Resources, UserError

PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "Explain in two sentences what a hash table is.",
           "List five fruits and one fact about each.",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"",
           "Translate to French: The cat sleeps on the warm windowsill.",
           "Write a haiku about autumn rain.",
           "What is the capital of Australia? Answer in one sentence.",
           "Summarise the rules of tic-tac-toe."]
MODES = ("sps", "psd")
NAMES = {"sps": "SD (draft, then verify)", "psd": "PSD (draft and verify overlap)"}
COLORS = {"target": "#1c7ed6", "drafter": "#f08c00"}
MODE_LINE = {"sps": "#868e96", "psd": "#2f9e44"}
REFRESH_S = 0.5
LIMITS = {"requests": (2, 16), "max_batch": (1, 8), "max_new": (8, 96), "rate": (0.0, 20.0)}


def check(requests, max_batch, max_new, rate) -> tuple[int, int, int, float]:
    vals = {"requests": requests, "max_batch": max_batch, "max_new": max_new, "rate": rate}
    for k, v in vals.items():
        lo, hi = LIMITS[k]
        if not isinstance(v, (int, float)) or not lo <= v <= hi:
            raise UserError(f"{k.replace('_', ' ')} must be between {lo} and {hi}, got {v!r}")
    return int(requests), int(max_batch), int(max_new), float(rate)


def timeline(runs: dict) -> Figure:
    """Gantt: one lane per (mode, process); a bar per busy interval, labelled with its rows."""
    data, lanes = [], []
    for mode, (trace, _) in runs.items():
        for who in ("target", "drafter"):
            lane = f"{NAMES[mode]} · {who}"
            lanes.append(lane)
            spans = [s for s in trace.spans if s["who"] == who]
            data.append(dict(type="bar", orientation="h", y=[lane] * len(spans),
                             x=[s["end"] - s["start"] for s in spans], base=[s["start"] for s in spans],
                             marker=dict(color=COLORS[who]), name=who, showlegend=mode == next(iter(runs)),
                             hovertext=[f"{who}: {1e3 * (s['end'] - s['start']):.0f} ms, {s['rows']} rows, "
                                        f"sub-batch {s['sub']}" for s in spans], hoverinfo="text"))
    return {"data": data, "layout": dict(title=dict(text="Who is busy when"), barmode="overlay", height=300,
                                         margin=dict(l=230, r=10, t=36, b=36), plot_bgcolor="white",
                                         xaxis=dict(title=dict(text="seconds"), **AXIS),
                                         yaxis=dict(categoryorder="array", categoryarray=lanes[::-1], **AXIS),
                                         font=dict(size=11), legend=dict(orientation="h", y=-0.25))}


def progress(runs: dict) -> Figure:
    """Generated tokens over time (the slope is the throughput)."""
    data = []
    for mode, (_, reqs) in runs.items():
        total = 0
        done = sorted((r.finish, len(r.tokens)) for r in reqs if r.finish is not None)
        xs, ys = [0.0], [0]
        for t, n in done:
            total += n
            xs.append(t)
            ys.append(total)
        data.append(dict(type="scatter", mode="lines+markers", x=xs, y=ys, name=NAMES[mode], line=dict(
            shape="hv", color=MODE_LINE[mode])))
    return {"data": data, "layout": dict(title=dict(text="Tokens of finished requests"), height=260,
                                         margin=dict(l=40, r=10, t=36, b=36), plot_bgcolor="white",
                                         xaxis=dict(title=dict(text="seconds"), **AXIS),
                                         yaxis=dict(title=dict(text="tokens"), **AXIS), font=dict(size=11),
                                         legend=dict(orientation="h", y=-0.3))}


def latency(runs: dict) -> Figure:
    data = [dict(type="bar", x=[f"#{r.rid}" for r in reqs if r.finish is not None],
                 y=[r.finish - r.arrival for r in reqs if r.finish is not None], name=NAMES[mode],
                 marker=dict(color=MODE_LINE[mode])) for mode, (_, reqs) in runs.items()]
    return {"data": data, "layout": dict(title=dict(text="End-to-end latency per request"), barmode="group",
                                         height=260, margin=dict(l=40, r=10, t=36, b=36), plot_bgcolor="white",
                                         xaxis=dict(title=dict(text="request"), **AXIS),
                                         yaxis=dict(title=dict(text="seconds"), **AXIS), font=dict(size=11),
                                         legend=dict(orientation="h", y=-0.3))}


def summary(runs: dict, note: str = "") -> str:
    rows = []
    for mode, (trace, reqs) in runs.items():
        fin = [r for r in reqs if r.finish is not None]
        toks = sum(len(r.tokens) for r in fin)
        span = max((r.finish for r in fin), default=0.0)
        b = trace.busy()
        rows.append(f"<tr><td>{html.escape(NAMES[mode])}</td><td>{len(fin)}/{len(reqs)}</td>"
                    f"<td>{toks / span if span else 0:.1f}</td><td>{1e3 * b['D']:.0f}</td><td>{1e3 * b['V']:.0f}</td>"
                    f"<td>{b['model_gain'] or 0:.2f}</td></tr>")
    return ("<table class='ssd-serve'><tr><th>mode</th><th>done</th><th>tok/s</th><th>D ms</th><th>V ms</th>"
            "<th>(D+V)/max(D,V)</th></tr>" + "".join(rows) + f"</table><p>{html.escape(note)}</p>")


def serve(res: Resources, requests, max_batch, max_new, rate, dtype: str = "auto") -> Iterator[tuple]:
    """Streams (timeline, progress, latency, summary html) while SD and then PSD serve the same load."""
    n, b, m, r = check(requests, max_batch, max_new, rate)
    yield None, None, None, "Loading the model (first run only)…" if not res.loaded else "Starting…"
    lm = res.lm(dtype)
    ids = [lm.encode(PROMPTS[i % len(PROMPTS)], chat=True) for i in range(n)]
    times = arrivals(n, r)
    cfg = EngineConfig(max_new_tokens=m)
    runs: dict = {}
    last = 0.0
    for mode in MODES:
        reqs = [Req(i, x, t) for i, (x, t) in enumerate(zip(ids, times))]
        note = f"{NAMES[mode]}: starting the drafter process…" if mode == "psd" else f"{NAMES[mode]}: running…"
        yield None, None, None, summary(runs, note)

        def steps(mode=mode, reqs=reqs):
            for trace in iter_mode(mode, lm, cfg, reqs, b, draft="self:8", gamma=4):
                yield trace, reqs
        for trace, reqs_ in res.worker.stream(steps):
            runs[mode] = (trace, reqs_)
            if time.monotonic() - last >= REFRESH_S:
                last = time.monotonic()
                yield (plot_value(timeline(runs)), plot_value(progress(runs)), plot_value(latency(runs)),
                       summary(runs, f"{NAMES[mode]}: running…"))
    yield (plot_value(timeline(runs)), plot_value(progress(runs)), plot_value(latency(runs)),
           summary(runs, "Done. PSD holds two sub-batches of the max batch each (MineDraft's setting); the drafter "
                         "is the model's first 8 layers, on its own core."))
