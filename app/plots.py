"""Plotly figures built from StepEvent streams (pure functions: events in, figure dict out).

Figures are plain Plotly JSON dicts ({"data": [...], "layout": {...}}), not `plotly.graph_objects` figures:
building and validating four `go.Figure`s costs ~40-80 ms of Python per refresh on a small CPU, taken from the
model while it generates; plain dicts cost < 1 ms. `plot_value` hands a dict to a `gr.Plot`; live refreshes
travel as the dicts themselves (app/live.py) and are drawn by the page script (app/page.js).
"""
from __future__ import annotations

import json
from typing import Sequence

from gradio.components.plot import PlotData

from switchsd.core.events import StepEvent

from .render import PATH_COLORS

LINE = {"copy": "#e8590c", "neural": "#2f9e44", "vanilla": "#868e96", "smc": "#0ca678", "lookahead": "#1971c2",
        "oracle": "#7048e8"}
AXIS = dict(gridcolor="#e9ecef", zerolinecolor="#ced4da", linecolor="#adb5bd", showline=True)

Figure = dict      # Plotly JSON: {"data": [trace dicts], "layout": {...}}


def _fig(data: list[dict], title: str, x: str, y: str, y_range: list[float] | None = None, **layout) -> Figure:
    yaxis = dict(title=dict(text=y), **AXIS)
    if y_range is not None:
        yaxis["range"] = y_range
    lay = dict(title=dict(text=title), height=260, margin=dict(l=40, r=10, t=36, b=36),
               xaxis=dict(title=dict(text=x), **AXIS), yaxis=yaxis, font=dict(size=11),
               legend=dict(orientation="h", y=-0.3), plot_bgcolor="white", paper_bgcolor="white")
    return {"data": data, "layout": {**lay, **layout}}


def plot_value(fig: Figure) -> PlotData:
    """The value a gr.Plot shows for a figure dict (Gradio's own format for Plotly JSON)."""
    return PlotData(type="plotly", plot=json.dumps(fig))


def accept_plot(events: Sequence[StepEvent]) -> Figure:
    """Accepted draft tokens per step, coloured by path."""
    data = []
    for path in dict.fromkeys(e.path for e in events):
        es = [e for e in events if e.path == path]
        data.append(dict(type="bar", x=[e.step for e in es], y=[len(e.accepted) for e in es], name=path,
                         marker=dict(color=PATH_COLORS.get(path, "#adb5bd"),
                                     line=dict(color=LINE.get(path, "#495057"), width=1))))
    return _fig(data, "acceptance length per step", "step", "accepted tokens")


def probe_plot(events: Sequence[StepEvent], tau: float) -> Figure:
    """Probe score over steps with the tau band and line, and copy-trigger markers."""
    es = [e for e in events if e.probe_score is not None]
    cp = [e for e in es if e.path == "copy"]
    data = [dict(type="scatter", mode="lines", name="probe", x=[e.step for e in es],
                 y=[e.probe_score for e in es], line=dict(color="#1c7ed6")),
            dict(type="scatter", mode="markers", name="copy triggered", x=[e.step for e in cp],
                 y=[e.probe_score for e in cp], marker=dict(color=LINE["copy"], size=8, symbol="triangle-up"))]
    shapes = [dict(type="rect", xref="x domain", x0=0, x1=1, yref="y", y0=tau - 0.05, y1=tau + 0.05,
                   fillcolor="#fab005", opacity=0.2, line=dict(width=0)),
              dict(type="line", xref="x domain", x0=0, x1=1, yref="y", y0=tau, y1=tau,
                   line=dict(color="#f08c00", dash="dash"))]
    notes = [dict(text=f"tau {tau:.2f}", showarrow=False, xref="x domain", x=1, xanchor="right", yref="y", y=tau,
                  yanchor="bottom")]
    return _fig(data, "probe score" if es else "probe score (this method reads no probe)", "step", "p(copy)",
                [0, 1], shapes=shapes, annotations=notes)


def copy_rate_plot(events: Sequence[StepEvent], window: int = 10) -> Figure:
    """Share of the last `window` steps on the copy path, and the cumulative share."""
    xs, roll, cum = [], [], []
    flags = [e.path == "copy" for e in events]
    n_copy = 0
    for i, e in enumerate(events):
        n_copy += flags[i]
        lo = max(0, i + 1 - window)
        xs.append(e.step)
        roll.append(sum(flags[lo:i + 1]) / (i + 1 - lo))
        cum.append(n_copy / (i + 1))
    data = [dict(type="scatter", mode="lines", x=xs, y=roll, name=f"last {window} steps",
                 line=dict(color=LINE["copy"])),
            dict(type="scatter", mode="lines", x=xs, y=cum, name="cumulative", line=dict(color="#495057", dash="dot"))]
    return _fig(data, "copy-trigger rate", "step", "share of steps", [0, 1])


def toks_plot(series: dict[str, tuple[list[float], list[int]]]) -> Figure:
    """Tokens vs time per method: series name -> (times s, cumulative tokens). Slope = Tok/s."""
    data = []
    for name, (ts, ns) in series.items():
        rate = ns[-1] / ts[-1] if ts and ts[-1] > 0 else 0.0
        data.append(dict(type="scatter", mode="lines", x=list(ts), y=list(ns), name=f"{name} ({rate:.1f} tok/s)"))
    return _fig(data, "tokens vs time (slope = Tok/s)", "seconds", "tokens")


def timeline(events: Sequence[StepEvent], t0: float = 0.0) -> tuple[list[float], list[int]]:
    """(end time of each step since the start, cumulative tokens) from the events' own timings."""
    t, n, ts, ns = t0, 0, [], []
    for e in events:
        t += e.timings.get("total", 0.0) + e.timings.get("prefill", 0.0)
        n += len(e.new_tokens)
        ts.append(t)
        ns.append(n)
    return ts, ns


def tok_per_fwd_plot(lanes: dict[str, Sequence[StepEvent]]) -> Figure:
    """Tokens committed per target forward, per step, for several methods."""
    data = [dict(type="scatter", mode="lines+markers", x=[e.step for e in events],
                 y=[len(e.new_tokens) for e in events], name=name, marker=dict(size=4))
            for name, events in lanes.items()]
    return _fig(data, "tokens per target forward", "step", "tokens")


def layer_plot(per_layer: Sequence[dict]) -> Figure:
    """Per-layer validation AUC and F1 from a probe's metadata, attention vs MLP sub-layer."""
    data = []
    for sub, dash in (("attn", "solid"), ("mlp", "dot")):
        rows = sorted((r for r in per_layer if r.get("sublayer") == sub), key=lambda r: r["layer"])
        if not rows:
            continue
        name = "after attention" if sub == "attn" else "after MLP"
        data.append(dict(type="scatter", mode="lines", x=[r["layer"] for r in rows], y=[r["auc"] for r in rows],
                         name=f"AUC {name}", line=dict(color="#1c7ed6", dash=dash)))
        data.append(dict(type="scatter", mode="lines", x=[r["layer"] for r in rows], y=[r["f1"] for r in rows],
                         name=f"F1 {name}", line=dict(color="#e8590c", dash=dash)))
    return _fig(data, "probe quality per layer (from the probe's metadata)", "layer", "score")
