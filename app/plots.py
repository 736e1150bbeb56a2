"""Plotly figures built from StepEvent streams (pure functions: events in, figure out)."""
from __future__ import annotations

import html
from typing import Sequence

import plotly.graph_objects as go

from switchsd.events import StepEvent

from .render import PATH_COLORS

LINE = {"copy": "#e8590c", "neural": "#2f9e44", "vanilla": "#868e96", "oracle": "#7048e8"}


AXIS = dict(gridcolor="#e9ecef", zerolinecolor="#ced4da", linecolor="#adb5bd", showline=True)


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    # template "none" + a few explicit styles: the default template is ~6 KB of JSON that the browser re-reads
    # on every live refresh of every plot (a figure here is < 1 KB without it)
    fig.update_layout(template="none", title=title, height=260, margin=dict(l=40, r=10, t=36, b=36),
                      xaxis=dict(title=x, **AXIS), yaxis=dict(title=y, **AXIS), font=dict(size=11),
                      legend=dict(orientation="h", y=-0.3), plot_bgcolor="white", paper_bgcolor="white")
    return fig


def accept_plot(events: Sequence[StepEvent]) -> go.Figure:
    """Accepted draft tokens per step, coloured by path."""
    fig = go.Figure()
    for path in dict.fromkeys(e.path for e in events):
        es = [e for e in events if e.path == path]
        fig.add_trace(go.Bar(x=[e.step for e in es], y=[len(e.accepted) for e in es], name=path,
                             marker_color=PATH_COLORS.get(path, "#adb5bd"), marker_line_color=LINE.get(path),
                             marker_line_width=1))
    return _layout(fig, "acceptance length per step", "step", "accepted tokens")


def probe_plot(events: Sequence[StepEvent], tau: float) -> go.Figure:
    """Probe score over steps with the tau line and copy-trigger markers."""
    fig = go.Figure()
    es = [e for e in events if e.probe_score is not None]
    fig.add_hrect(y0=tau - 0.05, y1=tau + 0.05, fillcolor="#fab005", opacity=0.2, line_width=0)
    fig.add_hline(y=tau, line_dash="dash", line_color="#f08c00", annotation_text=f"tau {tau:.2f}")
    fig.add_trace(go.Scatter(x=[e.step for e in es], y=[e.probe_score for e in es], mode="lines", name="probe",
                             line=dict(color="#1c7ed6")))
    cp = [e for e in es if e.path == "copy"]
    fig.add_trace(go.Scatter(x=[e.step for e in cp], y=[e.probe_score for e in cp], mode="markers",
                             name="copy triggered", marker=dict(color=LINE["copy"], size=8, symbol="triangle-up")))
    fig.update_yaxes(range=[0, 1])
    return _layout(fig, "probe score" if es else "probe score (this method reads no probe)", "step", "p(copy)")


def copy_rate_plot(events: Sequence[StepEvent], window: int = 10) -> go.Figure:
    """Share of the last `window` steps on the copy path, and the cumulative share."""
    xs, roll, cum = [], [], []
    n_copy = 0
    for i, e in enumerate(events):
        n_copy += e.path == "copy"
        lo = max(0, i + 1 - window)
        xs.append(e.step)
        roll.append(sum(x.path == "copy" for x in events[lo:i + 1]) / (i + 1 - lo))
        cum.append(n_copy / (i + 1))
    fig = go.Figure([go.Scatter(x=xs, y=roll, name=f"last {window} steps", line=dict(color=LINE["copy"])),
                     go.Scatter(x=xs, y=cum, name="cumulative", line=dict(color="#495057", dash="dot"))])
    fig.update_yaxes(range=[0, 1])
    return _layout(fig, "copy-trigger rate", "step", "share of steps")


def toks_plot(series: dict[str, tuple[list[float], list[int]]]) -> go.Figure:
    """Tokens vs time per method: series name -> (times s, cumulative tokens). Slope = Tok/s."""
    fig = go.Figure()
    for name, (ts, ns) in series.items():
        rate = ns[-1] / ts[-1] if ts and ts[-1] > 0 else 0.0
        fig.add_trace(go.Scatter(x=ts, y=ns, mode="lines", name=f"{name} ({rate:.1f} tok/s)"))
    return _layout(fig, "tokens vs time (slope = Tok/s)", "seconds", "tokens")


def timeline(events: Sequence[StepEvent], t0: float = 0.0) -> tuple[list[float], list[int]]:
    """(end time of each step since the start, cumulative tokens) from the events' own timings."""
    t, n, ts, ns = t0, 0, [], []
    for e in events:
        t += e.timings.get("total", 0.0) + e.timings.get("prefill", 0.0)
        n += len(e.new_tokens)
        ts.append(t)
        ns.append(n)
    return ts, ns


def tau_plot(lanes: dict[str, Sequence[StepEvent]]) -> go.Figure:
    """Tokens committed per target forward (tau per step) for several methods."""
    fig = go.Figure()
    for name, events in lanes.items():
        fig.add_trace(go.Scatter(x=[e.step for e in events], y=[len(e.new_tokens) for e in events],
                                 mode="lines+markers", name=name, marker=dict(size=4)))
    return _layout(fig, "tokens per target forward", "step", "tokens")


def layer_plot(per_layer: Sequence[dict]) -> go.Figure:
    """Per-layer validation AUC and F1 from a probe's metadata, attention vs MLP sub-layer."""
    fig = go.Figure()
    for sub, dash in (("attn", "solid"), ("mlp", "dot")):
        rows = sorted((r for r in per_layer if r.get("sublayer") == sub), key=lambda r: r["layer"])
        if not rows:
            continue
        name = "after attention" if sub == "attn" else "after MLP"
        fig.add_trace(go.Scatter(x=[r["layer"] for r in rows], y=[r["auc"] for r in rows], name=f"AUC {name}",
                                 line=dict(color="#1c7ed6", dash=dash)))
        fig.add_trace(go.Scatter(x=[r["layer"] for r in rows], y=[r["f1"] for r in rows], name=f"F1 {name}",
                                 line=dict(color="#e8590c", dash=dash)))
    return _layout(fig, "probe quality per layer (from the probe's metadata)", "layer", "score")


def live_html(figs: dict[str, go.Figure]) -> str:
    """Live refreshes of the plots while a run streams: each figure as JSON in a data attribute of a hidden
    element; the page script (render.HEAD_JS) redraws the plot with that id in place with Plotly.react. A
    gr.Plot update costs the browser ~3x more (Gradio follows every react with a full resize), and on a small
    machine the browser's work is taken from the model. The final figures still go to the gr.Plot components."""
    return "".join(f'<div class="ssd-fig" data-target="{html.escape(k)}" data-fig="{html.escape(f.to_json())}"></div>'
                   for k, f in figs.items())
