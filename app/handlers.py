"""Event handlers of the studio. They consume the engine's StepEvent stream; none of them decodes by itself.
Each returns/yields plain values (HTML strings, Plotly figures, state) so they can be tested without a browser."""
from __future__ import annotations

import html
import time
from contextlib import closing
from dataclasses import replace
from typing import Any, Iterator, NamedTuple

import gradio as gr
import torch

from switchsd import envs
from switchsd.core.events import StepEvent, summarize
from switchsd.io import check_text

from . import plots
from .live import BOARD
from .render import token_spans, tokens_html
from .resources import MAX_PROMPT_CHARS, Resources, UserError

MAX_NEW_TOKENS = 1024
# Every frame costs CPU twice: here (HTML, figure dicts, serialisation) and in the browser (DOM, drawing), and on
# a small machine the browser shares the cores with the model. So figures are plain dicts (plots.py: building
# go.Figures took 40-80 ms per refresh) and live plots are drawn by the page script (app/page.js: a canvas
# on small machines, since a Plotly redraw costs ~10 ms of browser CPU per plot).
REFRESH_S = envs.get("SWITCHSD_REFRESH_S")        # the token view, not per token
PLOT_REFRESH_S = envs.get("SWITCHSD_PLOT_REFRESH_S")   # the four live plots
FULL_REFRESH_S = envs.get("SWITCHSD_FULL_REFRESH_S")   # whole view through Gradio (API)
# the first live frame once a run has lasted this long: a frame costs the browser tens of ms of CPU on the cores the
# engine decodes on, which a run of a few hundred ms (128 tokens at q4q8's speed) would pay for nothing
FIRST_FRAME_S = envs.get("SWITCHSD_FIRST_FRAME_S")
# a click costs the browser 60-100 ms of CPU (Gradio's request and messages, the status, style and layout of a
# page holding the last run's plots and tokens); the engine starts this long after the click so that this work
# does not land on its prefill (measured: prefills of 70 ms ran 100-290 ms without the pause)
SETTLE_S = envs.get("SWITCHSD_SETTLE_S")
PLOT_IDS = ("plot-accept", "plot-probe", "plot-copy-rate", "plot-toks")    # elem ids, in output order
UI_SHARE = 0.05            # ...and both less often when drawing would take more than this share of the time


class GenerateFrame(NamedTuple):
    """One update of the Generate tab: its fields are the tab's outputs, in the order the studio wires them."""
    tokens: Any
    status: Any
    accept_plot: Any
    probe_plot: Any
    copy_rate_plot: Any
    toks_plot: Any
    state: Any          # the finished run, for the step inspector
    live: Any           # names the streaming run for the page script (app/live.py)

    @classmethod
    def of(cls, **fields) -> "GenerateFrame":
        """A frame that updates only `fields` (every other output is left as it is)."""
        return cls(**{f: fields.get(f, gr.skip()) for f in cls._fields})


def check_prompt(res: Resources, prompt: str, chat: bool) -> list[int]:
    if prompt is None or not prompt.strip():
        raise UserError("The prompt is empty: type something or pick a preset.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt has {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}.")
    try:
        check_text(prompt, "The prompt")
    except ValueError as e:
        raise UserError(f"{e}.") from None
    lm = res.lm()
    try:
        ids = lm.encode(prompt, chat=chat)
    except ValueError as e:
        raise UserError(str(e)) from None
    if len(ids) + 1 >= lm.max_length:
        raise UserError(f"The prompt has {len(ids)} tokens; the model's context is {lm.max_length}.")
    return ids


def check_max_new(n) -> int:
    try:
        n = int(n)
    except (TypeError, ValueError):
        raise UserError("Max new tokens must be a whole number.") from None
    if not 1 <= n <= MAX_NEW_TOKENS:
        raise UserError(f"Max new tokens must be between 1 and {MAX_NEW_TOKENS}.")
    return n


def status_line(s: dict, done: bool | None = False, note: str = "") -> str:
    """HTML (cheaper for the browser than Markdown on every frame); done None = stopped by the user."""
    paths = ", ".join(f"{html.escape(k)} {v['pct']:.0f}% of steps (MAL {v['mal']:.2f})" for k, v in s["paths"].items())
    head = {True: "<b>Done</b> · ", False: "Generating… · ", None: "<b>Stopped</b> · "}[done]
    return (f'<span class="ssd-status">{head}'
            f"<b>{s['new_tokens']} tokens</b> · {s['steps']} target forwards · {s['tok_per_fwd']:.2f} tokens/forward · "
            f"<b>{s['tok_s']:.1f} tok/s</b> · {paths}{note}</span>")


def engine_tau(engine) -> float:
    """The gate's threshold (0.0 included), else the probe's own, else 0.5 for drawing."""
    tau = getattr(engine.policy, "tau", None)
    if tau is not None:
        return tau
    return engine.probe.tau if engine.probe is not None else 0.5


def _events(engine, ids: list[int]) -> Iterator[StepEvent]:
    with closing(engine):
        yield from engine.generate(ids, torch.Generator().manual_seed(0))


def generate(res: Resources, prompt: str, method: str, temperature: float, max_new: int, chat: bool,
             tau: float | None, kappa: int, width: int, depth: int, gamma: int,
             session: str | None = None, dtype: str = "auto", queued_at: float | None = None
             ) -> Iterator[GenerateFrame]:
    """Streams GenerateFrames: tokens html, status, the four figures, the run's events, the live marker.
    Gradio carries the first frame (whose live html names the run on the live board), a full refresh every
    FULL_REFRESH_S for API clients, and the final frame with the figures; in between the page script polls the
    board (app/live.py) for new token spans, live figures and the status line."""
    t_click = queued_at if queued_at is not None else time.monotonic()    # a Stop after this cancels the run
    try:
        first = "Loading the model (first run only)…" if not res.loaded else "Starting…"
        yield GenerateFrame.of(status=first)
        ids = check_prompt(res, prompt, chat)
        max_new = check_max_new(max_new)
        engine = res.engine(method, max_new, temperature, tau, kappa, width, depth, gamma, dtype=dtype)
    except UserError as e:
        raise gr.Error(str(e))
    except Exception as e:  # loading failures: shown in the UI, never a traceback
        raise gr.Error(f"{e.__class__.__name__}: {e}")
    if res.worker.cancelled_since(session or "", t_click):      # Stop came while the engine was being built
        engine.close()
        yield GenerateFrame.of(status="<b>Stopped</b> before the first token.")
        return
    lm = res.lm(dtype)
    t_tau = engine_tau(engine)
    vkey = (lm.precision, tuple(ids), max_new)     # a greedy vanilla run of the same prompt, if there was one
    events: list[StepEvent] = []
    token = BOARD.open()            # the page script polls this run's live frames (app/live.py)
    # The engine runs on the torch thread and never waits for a frame; drawing (here) and the browser still
    # share the CPU with it, so drawing is timed and the refresh interval grows when it would cost more than
    # UI_SHARE of the wall time. Tok/s shown = tokens / wall time from the engine's start, drawing included.
    settle = SETTLE_S - (time.monotonic() - t_click)
    if settle > 0:                  # the page's own work on the click first (SETTLE_S)
        time.sleep(settle)
    t0 = time.perf_counter()
    last, last_plot, last_full, ui_cost, ui_total = 0.0, t0, t0, 0.0, 0.0
    posted = 0                                                   # events whose spans are on the board

    def figures() -> tuple:
        return (plots.accept_plot(events), plots.probe_plot(events, t_tau), plots.copy_rate_plot(events),
                plots.toks_plot({method: plots.timeline(events)}))

    def final(line: str) -> GenerateFrame:  # the inspector reads the final run's events
        BOARD.post(token, done=True)
        # the inspector's state: no hidden vectors (they would sit in the session for nothing)
        state = {"events": [replace(e, hidden=None) for e in events], "prompt": ids, "tau": t_tau, "method": method,
                 "tokenizer": lm.tokenizer}
        return GenerateFrame(tokens_html(lm.tokenizer, events, t_tau, ids), line, *map(plots.plot_value, figures()),
                             state=state, live="")

    # Stop (studio.stop_fn -> worker.cancel) ends this stream at the engine's next step; the run then ends with
    # a "Stopped" frame below
    stream = res.worker.stream(lambda: _events(engine, ids), key=session or "", since=t_click)
    try:
        for e in stream:
            events.append(e)
            now = time.perf_counter()
            done = e.finished is not None
            if (now - last < max(REFRESH_S, ui_cost / UI_SHARE) or now - t0 < FIRST_FRAME_S) and not done:
                continue
            s = summarize(events, now - t0)
            if done:                        # the final frame: everything through Gradio, the board closes
                note = f" · drawing {100 * ui_total / (now - t0):.0f}% of the time"
                if getattr(engine, "approximate", False):
                    note = (" · <b>APPROXIMATE</b> (SMC-SD: a sample of the target's law only as the particles grow; "
                            f"mean ESS {(events[0].gate or {}).get('mean_ess', 0):.2f})") + note
                out = [t for x in events for t in x.new_tokens]
                if float(temperature) == 0.0 and method == "vanilla":
                    res.remember_vanilla(vkey, out, s["tok_s"])
                elif float(temperature) == 0.0 and (ref := res.vanilla_run(vkey)) is not None:
                    note = (f" · <b>{s['tok_s'] / ref[1]:.2f}x</b> vanilla's {ref[1]:.1f} tok/s on this prompt, "
                            f"{'equal to' if out == ref[0] else 'differs from'} vanilla's text") + note
                yield final(status_line(s, True, note))
                return
            line = status_line(s)
            with_plots = now - last_plot >= max(PLOT_REFRESH_S, ui_cost / UI_SHARE)
            figs = figures() if with_plots else None
            first = posted == 0
            BOARD.post(token, [token_spans(lm.tokenizer, [x], t_tau) for x in events[posted:]],
                       dict(zip(PLOT_IDS, figs)) if figs else None, line)
            posted = len(events)
            if first or now - last_full >= FULL_REFRESH_S:
                # the first frame names the run for the page script; later ones serve API clients (gradio_client)
                live = (f'<div class="ssd-run" data-run="{token}" data-every="{int(1000 * REFRESH_S)}"></div>'
                        if first else gr.skip())
                # without the prompt's context spans (the final frame brings them): the browser renders a
                # Gradio HTML update of a few hundred spans in ~140 ms of CPU, which the engine would share
                yield GenerateFrame.of(tokens=tokens_html(lm.tokenizer, events, t_tau, show_prompt=False),
                                       status=line, live=live)
                last_full = now
            last = time.perf_counter()
            last_plot = last if with_plots else last_plot
            ui_cost = last - now
            ui_total += ui_cost
        if events:                          # stopped before the end: show what was written
            yield final(status_line(summarize(events, time.perf_counter() - t0), None))
        else:                               # stopped (or left) before the engine produced a step
            yield GenerateFrame.of(status="<b>Stopped</b> before the first token.", live="")
    except gr.Error:
        raise
    except Exception as e:  # a failure inside the engine: shown in the UI, never a traceback
        raise gr.Error(f"generation failed: {e.__class__.__name__}: {e}")
    finally:
        BOARD.post(token, done=True)
        stream.close()
        res.worker.post(engine.close)       # also when the stream ended before the engine ever ran (idempotent)


def default_step(events: list[StepEvent]) -> int:
    """The step the inspector opens on: the neural step that accepted the most draft tokens (the switch's neural
    half at work), else the step of any path that accepted the most, else the first step; earliest on ties."""
    for pool in ([i for i, e in enumerate(events) if e.accepted and e.path == "neural"],
                 [i for i, e in enumerate(events) if e.accepted]):
        if pool:
            return max(pool, key=lambda i: (len(events[i].accepted), -i))
    return 0


def inspect_last_run(state: dict | None) -> tuple[dict, str]:
    """After a Generate run: the step slider's range and value (`default_step`), and that step's view."""
    events = (state or {}).get("events") or []
    step = default_step(events)
    return gr.update(maximum=max(1, len(events) - 1), value=step), explain_step(state, step)


def explain_step(state: dict | None, step: int) -> str:
    """The step inspector: candidates as a trie, accepted / rejected nodes, bonus, gate decision."""
    if not state or not state.get("events"):
        return "<i>Generate something first; then pick a step.</i>"
    events = state["events"]
    step = max(0, min(int(step), len(events) - 1))
    e = events[step]
    from .render import token_text
    tok = lambda t: html.escape(token_text(_tokenizer_of(state), t)).replace(" ", "␣").replace("\n", "⏎")
    acc = set(e.accepted_rows)
    children: dict[int, list[int]] = {}
    for r in range(1, len(e.tree_tokens)):
        children.setdefault(e.tree_parents[r], []).append(r)

    def node(r: int) -> str:
        kids = "".join(node(c) for c in children.get(r, []))
        cls = "acc" if r in acc else "rej"
        label = "✓" if r in acc else "✗"
        return (f'<li><span class="n {cls}" data-row="{r}">{tok(e.tree_tokens[r])} {label}</span>'
                + (f"<ul>{kids}</ul>" if kids else "") + "</li>")

    tree = "".join(node(c) for c in children.get(0, []))
    gate = ""
    if e.gate and "kgram_match" in e.gate:
        p = e.gate.get("probe")
        tau = e.gate.get("tau")
        head = (f"<p><b>Gate:</b> probe {'n/a' if p is None else f'{p:.3f}'} vs tau "
                f"{'n/a' if tau is None else f'{tau:.2f}'}; "
                f"kappa-gram seen earlier: {'yes' if e.gate['kgram_match'] else 'no'}")
        if e.gate.get("mode") == "cost":    # the cost gate: plausibility, then the best-paying option
            best = ", ".join(f"{html.escape(str(k))} {v:.0f}" for k, v in (e.gate.get("expected_tok_s") or {}).items())
            gate = (f"{head} → copying {'plausible' if e.gate['copy'] else 'not plausible'}; the cost gate ran "
                    f"<b>{html.escape(str(e.gate.get('choice')))}</b>"
                    f"{' (exploring)' if e.gate.get('explore') else ''} (expected tok/s: {best})"
                    + (f"; the head's probability of each chain token: "
                       f"{', '.join(f'{c:.2f}' for c in e.gate['neural_conf'])}" if e.gate.get("neural_conf") else "")
                    + ".</p>")
        else:
            gate = f"{head} → <b>{'copy' if e.gate['copy'] else 'neural'}</b> path.</p>"
    elif e.gate and "arm" in e.gate:
        gate = f"<p><b>Bandit:</b> UCB picked the {html.escape(str(e.gate['arm']))} arm.</p>"
    bonus = "none (cut by EOS or the token limit)" if e.bonus is None else tok(e.bonus)
    return f"""<style>
.insp ul{{list-style:none;padding-left:18px;margin:2px 0}} .insp .n{{font-family:ui-monospace,monospace;
padding:1px 5px;border-radius:3px}} .insp .acc{{background:#d3f9d8}} .insp .rej{{background:#ffe3e3}}
</style><div class="insp"><p><b>Step {e.step}</b> · path <b>{html.escape(e.path)}</b> · verified
{e.n_verified} tokens in one target forward · accepted {len(e.accepted)} · bonus {bonus}</p>{gate}
<p>Pending token (root): <span class="n">{tok(e.tree_tokens[0])}</span></p>
<ul>{tree or '<li><i>no draft: a plain step</i></li>'}</ul></div>"""


def _tokenizer_of(state):
    return state["tokenizer"]


EXPLANATION = """**How speculative decoding works.** A cheap *drafter* guesses the next few tokens; the big *target*
model checks all guesses in **one** forward pass. Every guessed token the target agrees with is kept (✓), the
first disagreement is replaced by the target's own choice (the *bonus* token), and the rest is thrown away (✗).
The output is exactly what the target alone would have written — only faster, because one forward can commit
several tokens.

**Two kinds of drafters.** *Copying* proposes the continuation of an earlier occurrence of the current words
(free to compute, great when the model really copies). A *neural drafter* (EAGLE3 head, small model) predicts
from the target's hidden states (robust everywhere).

**SwitchSD's gate.** A linear probe reads the target's hidden state: is the model about to copy? SwitchSD copies
only if the probe says yes (score ≥ tau) **and** the last kappa tokens occurred earlier; otherwise the neural
drafter runs. Several copy candidates are merged into a trie and verified together."""
