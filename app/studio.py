"""The studio's layout and event wiring. `build_demo(resources)` returns a gr.Blocks (no server started)."""
from __future__ import annotations

from typing import NamedTuple

import gradio as gr

from switchsd.core.config import CopyConfig, EngineConfig, GateConfig, SamplingConfig
from switchsd.core.rules import RULES
from switchsd.methods import METHODS

from . import handlers, plots, probelab, probetrain, race, serving, verifylab
from .guard import GUARD
from .render import CSS
from .resources import Resources, UserError

STATE_TTL_S = 1800          # a tab's last run (events for the inspector, lab scores) is dropped after 30 min

# the knobs start at the library defaults
COPY, GATE, SAMPLING, ENGINE = CopyConfig(), GateConfig(), SamplingConfig(), EngineConfig()

class Preset(NamedTuple):
    prompt: str
    regime: str     # what the preset shows, under the dropdown


PRESETS = {
    "Copy: JSON echo": Preset(
        'Repeat this JSON exactly, then stop: {"name": "Alice", "age": 30, "city": "Paris", '
        '"skills": ["python", "sql", "statistics"], "active": true}',
        "The answer repeats the prompt. The probe reads the model's intent to copy and SwitchSD drafts long runs "
        "from the context (copy-coloured tokens), several per target forward. `eagle3` has nothing to copy with."),
    "Copy: code rewrite": Preset(
        "Add type hints to this function and keep everything else identical:\n\n"
        "def moving_average(values, window):\n    result = []\n"
        "    for i in range(len(values) - window + 1):\n"
        "        result.append(sum(values[i:i + window]) / window)\n    return result",
        "Most of the answer is the function again, with small edits: copy runs break at each edit (a bonus token) "
        "and resume after it."),
    "Math: accidental repetition": Preset(
        "Let n be a positive integer. Show that n^2 + n is even by considering n = 2k and n = 2k + 1.",
        "Formulas repeat short n-grams (n = 2k, 2k + 1) that the model is not copying. Prompt lookup (`pld`) "
        "drafts at every repeat; SwitchSD's probe keeps most of those steps off the copy path (compare the "
        "status lines of `pld` and `switchsd`)."),
    "Chat: free text": Preset(
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Nothing to copy: these steps belong to the neural drafter (the EAGLE-3 head). The cost gate drafts only "
        "where the head's measured acceptance pays for the wider verify on this device; with the shipped head on "
        "a CPU that is rare, and the steps run plain (docs/results.md)."),
}


def quiet_queue(demo: gr.Blocks) -> gr.Blocks:
    """Gradio's queue polls for work every 1 ms (and for progress every 10 ms), also while a job runs: ~1000
    wake-ups a second that preempt the engine's threads on a small CPU (the server alone idled at 5% of a core).
    50 ms / 250 ms is plenty for one queue worker per device and costs a click at most 50 ms."""
    q = getattr(demo, "_queue", None)
    if q is not None and hasattr(q, "sleep_when_free"):
        q.sleep_when_free = max(q.sleep_when_free, 0.05)
        q.progress_update_sleep_when_free = max(getattr(q, "progress_update_sleep_when_free", 0.0), 0.25)
    return demo


def _ui_error(fn):
    """Turn UserError into a visible gr.Error (no tracebacks in the page)."""
    def wrapped(*a):
        try:
            return fn(*a)
        except UserError as e:
            raise gr.Error(str(e))
    return wrapped


def _header(res: Resources) -> tuple[gr.Markdown, gr.Radio]:
    gr.HTML(f"<style>{CSS}</style>")
    gr.Markdown("# SwitchSD Studio\nSpeculative decoding that copies from the context only when the model "
                "itself intends to copy. Every token is coloured by the path that drafted it.")
    with gr.Row():
        model_status = gr.Markdown(res.status(), elem_id="model-status")
        four = res.four_bit_formats()
        precision = gr.Radio(["auto", "float32"] + four, value="auto", elem_id="precision",
                             label="Precision: auto = the fastest here (for a 4-bit GGUF model like the offline "
                                   "default q4q8 or int4, whichever calibrate measured faster: every method equals "
                                   "that format's vanilla; else bfloat16 on CPUs with native bf16: equal up to "
                                   "near-ties); float32 = token-for-token identical to vanilla"
                                   + ("; q4q8 / int4 = the GGUF's own 4-bit weights (CPU)" if four else ""))
    return model_status, precision


def generate_tab(res: Resources, precision: gr.Radio, model_status: gr.Markdown) -> tuple:
    """One method, streamed: tokens coloured by path and probe score, live plots. Returns what the other tabs and
    the page load use: (chat checkbox, run state, the generate event, empty-plots function, the plot outputs)."""
    with gr.Tab("Generate", id="tab-generate"):
        with gr.Row():
            with gr.Column(scale=3):
                preset = gr.Dropdown(list(PRESETS), label="Preset: one regime each", value=None, elem_id="preset")
                regime = gr.Markdown(elem_id="preset-regime")
                prompt = gr.Textbox(label="Prompt", lines=5, elem_id="prompt", value=PRESETS["Copy: JSON echo"].prompt)
            with gr.Column(scale=2):
                method = gr.Dropdown(list(METHODS), value=res.default_method(), label="Method", elem_id="method")
                with gr.Row():
                    temperature = gr.Slider(0.0, 1.5, value=SAMPLING.temperature, step=0.05, label="Temperature")
                    max_new = gr.Slider(1, handlers.MAX_NEW_TOKENS, value=ENGINE.max_new_tokens, step=1,
                                          label="Max new tokens")
                chat = gr.Checkbox(value=True, label="Chat template")
                with gr.Accordion("Gate and drafter knobs", open=False):
                    with gr.Row():
                        tau_on = gr.Checkbox(False, label="override the probe's tau")
                        tau = gr.Slider(0.0, 1.0, value=0.5, step=0.01, label="tau")
                    with gr.Row():
                        kappa = gr.Number(0, precision=0, minimum=0, maximum=32,
                                          label=f"kappa (0: the method's own: {GATE.kappa} in the cost gate, "
                                                f"{COPY.kappa} in the copy drafter, as on the command line)")
                        width = gr.Number(COPY.max_candidates, label="W candidates", precision=0, minimum=1, maximum=64)
                        depth = gr.Number(COPY.max_draft_len, label="D tokens", precision=0, minimum=1, maximum=64)
                        gamma = gr.Number(0, label="gamma (0: default shape, cost-chosen chain)", precision=0,
                                          minimum=0, maximum=16)
                with gr.Row():
                    run = gr.Button("Generate", variant="primary", elem_id="run")
                    stop = gr.Button("Stop", elem_id="stop")
        out = {"status": gr.HTML(elem_id="status"), "tokens": gr.HTML(elem_id="tokens-view")}
        with gr.Row():
            out["accept_plot"] = gr.Plot(elem_id=handlers.PLOT_IDS[0], show_label=False)
            out["probe_plot"] = gr.Plot(elem_id=handlers.PLOT_IDS[1], show_label=False)
        with gr.Row():
            out["copy_rate_plot"] = gr.Plot(elem_id=handlers.PLOT_IDS[2], show_label=False)
            out["toks_plot"] = gr.Plot(elem_id=handlers.PLOT_IDS[3], show_label=False)
        out["live"] = gr.HTML(elem_id="live-plots")     # hidden: names the streaming run for the page script
    out["state"] = gr.State(None, time_to_live=STATE_TTL_S)
    plot_outputs = [out[f] for f in ("accept_plot", "probe_plot", "copy_rate_plot", "toks_plot")]

    # empty axes from the start (live frames draw over them; Plotly.js is loaded for ?live=plotly)
    empty = (plots.accept_plot([]), plots.probe_plot([], 0.5), plots.copy_rate_plot([]), plots.toks_plot({}))
    empty_plots = lambda: tuple(map(plots.plot_value, empty))       # noqa: E731
    preset.change(lambda p: (PRESETS[p].prompt, f"*{PRESETS[p].regime}*") if p in PRESETS else (gr.skip(), ""),
                  preset, [prompt, regime], queue=False)

    def gen(p, m, t, n, c, on, tau_, k, w, d, g, dt, request: gr.Request):
        session = getattr(request, "session_hash", None)
        yield from handlers.generate(res, p, m, t, n, c, tau_ if on else None, k, w, d, g, session=session,
                                     dtype=dt, queued_at=GUARD.queued_at(session, "generate"))

    def stop_fn(request: gr.Request):       # stops this session's engine at its next step
        res.worker.cancel(getattr(request, "session_hash", None) or "")

    gen_ev = run.click(gen, [prompt, method, temperature, max_new, chat, tau_on, tau, kappa, width, depth, gamma,
                             precision], [out[f] for f in handlers.GenerateFrame._fields],
                       concurrency_limit=1, concurrency_id="device", api_name="generate",
                       show_progress="hidden")   # our status line says it; Gradio's animated overlay costs CPU
    gen_ev.then(lambda: res.status(), None, model_status, queue=False)
    # the run ends with a "Stopped" frame (not a Gradio cancel); a run still queued never starts
    stop.click(stop_fn, None, None, queue=False, api_name="stop")
    return chat, out["state"], gen_ev, empty_plots, plot_outputs


def race_tab(res: Resources, precision: gr.Radio, chat: gr.Checkbox, model_status: gr.Markdown) -> None:
    with gr.Tab("Race", id="tab-race"):
        gr.Markdown("Vanilla vs SwitchSD vs EAGLE3 vs CopySpec on one prompt, with the defaults. Every lane is timed "
                    "the same way: a short warm-up of each method first, then rounds in which **the lanes take turns of "
                    f"{race.TURN} steps each** (in a shuffled order), each lane's clock counting only its own steps. "
                    "Vanilla shows its median run; every other lane shows the round of its median speedup, with its "
                    "tok/s and vanilla's tok/s in that same round, replayed on a common clock, with its paths and "
                    "whether its text equals vanilla's. A lane whose cost gate kept it plain says why.")
        with gr.Row():
            prompt = gr.Textbox(label="Prompt", lines=3, value=PRESETS["Copy: code rewrite"].prompt,
                                elem_id="race-prompt", scale=3)
            with gr.Column(scale=1):
                max_new = gr.Slider(1, 512, value=96, step=1, label="Max new tokens", elem_id="race-max-new")
                repeats = gr.Slider(1, 9, value=race.RACE_REPEATS, step=1, elem_id="race-repeats",
                                    label="Runs per lane (the median is shown)")
                with_vanilla = gr.Checkbox(value=True, label="Show the vanilla lane")
                no_gate = gr.Checkbox(value=False, elem_id="race-no-gate",
                                      label="Add EAGLE3 without the cost gate (the head drafts every step)")
                run = gr.Button("Race", variant="primary", elem_id="race-run")
        out = {"status": gr.Markdown(elem_id="race-status"), "lanes": gr.HTML(elem_id="race-lanes")}
        with gr.Row():
            out["toks_plot"] = gr.Plot(elem_id="race-plot-toks", show_label=False)
            out["tok_per_fwd_plot"] = gr.Plot(elem_id="race-plot-tok-per-fwd", show_label=False)
    # show_progress hidden: Gradio's animated overlay costs browser CPU beside the model's threads (the status
    # line says what runs)
    ev = run.click(lambda p, n, c, v, dt, r, ng: (yield from race.race(res, p, n, c, v, dtype=dt, repeats=r,
                                                                          no_gate=ng)),
                   [prompt, max_new, chat, with_vanilla, precision, repeats, no_gate],
                   [out[f] for f in race.RaceFrame._fields], concurrency_limit=1, concurrency_id="device",
                   api_name="race", show_progress="hidden")
    ev.then(lambda: res.status(), None, model_status, queue=False)


def probe_lab_tab(res: Resources, model_status: gr.Markdown):
    with gr.Tab("Probe lab", id="tab-probe"):
        with gr.Row():
            with gr.Column(scale=2):
                probe_a = gr.Dropdown(res.shipped_probes(), label="Probe", value=(res.shipped_probes() or [None])[0],
                                      elem_id="probe-a")
                probe_b = gr.Dropdown([""] + res.shipped_probes(), label="Compare with (optional)", value="",
                                      elem_id="probe-b")
                upload = gr.File(label="…or upload a .safetensors probe", file_types=[".safetensors"],
                                 elem_id="probe-upload")
            with gr.Column(scale=3):
                text = gr.Textbox(label="Text (or a prompt to generate from)", lines=5,
                                  value=PRESETS["Copy: JSON echo"].prompt, elem_id="lab-text")
                with gr.Row():
                    generate = gr.Checkbox(value=True, label="Generate a completion first")
                    run = gr.Button("Score", variant="primary", elem_id="lab-run")
        tau = gr.Slider(0.0, 1.0, value=0.5, step=0.01, label="threshold (re-colours instantly)", elem_id="lab-tau")
        view = gr.HTML(elem_id="lab-view")
        layers = gr.Plot(elem_id="plot-layers", show_label=False)
        with gr.Row():
            train = gr.Button("Train a probe for this model (bundled prompts, a few minutes)", elem_id="lab-train")
            trained = gr.Markdown(elem_id="lab-trained")
        state = gr.State(None, time_to_live=STATE_TTL_S)

    def lab(a, b, up, text_, gen):
        probes, names = probelab.load_probes(res, a, b, up)
        st = res.worker.call(probelab.score_text, res, probes, names, text_, gen)
        meta = st["meta"][0]
        fig = plots.plot_value(plots.layer_plot(meta.get("per_layer", [])))
        return st, probelab.render(res, st, st["taus"][0]), fig, st["taus"][0]

    def train_new(progress=gr.Progress()):
        name, meta = probetrain.train_probe(res, progress)
        best = max(meta.get("per_layer", []), key=lambda r: r["f1"], default={})
        note = (f"**{name}**: layer {best.get('layer')} {best.get('sublayer')}, validation AUC "
                f"{best.get('auc', 0):.3f}, F1 {best.get('f1', 0):.3f}; the probe of the next Generate run.")
        fig = plots.plot_value(plots.layer_plot(meta.get("per_layer", [])))
        return gr.update(choices=res.shipped_probes(), value=name), fig, note, res.status()

    train.click(_ui_error(train_new), None, [probe_a, layers, trained, model_status], concurrency_limit=1,
                concurrency_id="device", api_name="train_probe")
    tau.release(_ui_error(lambda st, t: probelab.render(res, st, t)), [state, tau], view, queue=False)
    return run.click(_ui_error(lab), [probe_a, probe_b, upload, text, generate], [state, view, layers, tau],
                     concurrency_limit=1, concurrency_id="device", api_name="probe_lab")


LAB_PROMPT = ("Tom has 7 apples. Tom gets 5 more apples, then gives away 3 apples. How many apples does Tom have "
              "now? Explain step by step.")


def verification_lab_tab(res: Resources) -> tuple:
    """A verification rule (lossy unless it is `lossless`): acceptance per drafted token, p / q / output bars,
    and the accuracy-vs-speed Pareto plot of the shipped quality run. Returns that plot (filled on page load)."""
    with gr.Tab("Verification lab", id="tab-verify"):
        gr.Markdown("Relax verification and see what it does. Every rule except `lossless` is **lossy**: the text "
                    "no longer follows the target's distribution. Tokens are coloured by the rule's acceptance "
                    "probability; pick a position to compare the target p, the EAGLE-3 draft q and the rule's "
                    "output law there (docs/results.md explains the rules and the measured quality).")
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", lines=4, value=LAB_PROMPT, elem_id="vl-prompt")
            with gr.Column(scale=2):
                rule = gr.Dropdown(list(RULES), value="lenience", label="Rule", elem_id="vl-rule")
                knob = gr.Slider(0.0, 5.0, value=0.6, step=0.05, elem_id="vl-knob",
                                 label="knob: minp p_base · eta eps · lenience l · cos / capped lam · "
                                       "cos-contrastive mu · easd entropy threshold (nats)")
                with gr.Row():
                    temperature = gr.Slider(0.05, 1.5, value=0.7, step=0.05, label="Temperature")
                    max_new = gr.Slider(8, verifylab.MAX_LAB_TOKENS, value=48, step=1, label="Max new tokens")
                run = gr.Button("Run", variant="primary", elem_id="vl-run")
        view = gr.HTML(elem_id="vl-view")
        pos = gr.Slider(0, verifylab.MAX_LAB_TOKENS - 1, value=0, step=1, label="position (emitted token)",
                        elem_id="vl-pos")
        bars = gr.Plot(elem_id="vl-bars", show_label=False)
        pareto = gr.Plot(elem_id="vl-pareto", show_label=False)
        state = gr.State(None, time_to_live=STATE_TTL_S)

    def go(p, r, k, t, n):
        st = verifylab.run(res, p, r, k, t, n)
        return (st, verifylab.view(res, st), plots.plot_value(verifylab.bars(res, st, 0)),
                gr.update(maximum=max(1, len(st["tokens"]) - 1), value=0))

    lab_ev = run.click(_ui_error(go), [prompt, rule, knob, temperature, max_new], [state, view, bars, pos],
              concurrency_limit=1, concurrency_id="device", api_name="verify_lab")
    pos.change(_ui_error(lambda st, i: plots.plot_value(verifylab.bars(res, st, i))), [state, pos], bars,
               queue=False)
    return pareto, lab_ev


def serving_tab(res: Resources):
    """A small request load: batched SD vs MineDraft's PSD, drawn as it runs."""
    with gr.Tab("Serving", id="tab-serving"):
        gr.Markdown("Many requests at once. **SD**: one process drafts (the model's first 8 layers as the draft "
                    "model) and then verifies, for the whole batch. **PSD** (MineDraft): the drafter runs in its "
                    "own process on its own core and drafts one sub-batch while the target verifies the other. "
                    "Outputs are identical either way (greedy); only the timing differs. "
                    "`python -m switchsd serve-bench` measures the same at larger loads.")
        with gr.Row():
            lo, hi = serving.LIMITS["requests"]
            n = gr.Slider(lo, hi, value=6, step=1, label="Requests", elem_id="sv-requests")
            lo, hi = serving.LIMITS["max_batch"]
            b = gr.Slider(lo, hi, value=2, step=1, label="Max batch (per sub-batch for PSD)", elem_id="sv-batch")
            lo, hi = serving.LIMITS["max_new"]
            m = gr.Slider(lo, hi, value=24, step=1, label="Max new tokens", elem_id="sv-max-new")
            lo, hi = serving.LIMITS["rate"]
            r = gr.Slider(lo, hi, value=0.0, step=0.5, label="Arrivals per second (0: all at once)",
                          elem_id="sv-rate")
        go = gr.Button("Run the load", variant="primary", elem_id="sv-run")
        info = gr.HTML(elem_id="sv-summary")
        gantt = gr.Plot(elem_id="sv-gantt", show_label=False)
        with gr.Row():
            prog = gr.Plot(elem_id="sv-progress", show_label=False)
            lat = gr.Plot(elem_id="sv-latency", show_label=False)

    def run(*a):
        try:
            yield from serving.serve(res, *a)
        except UserError as e:
            raise gr.Error(str(e))
        except gr.Error:
            raise
        except Exception as e:  # a failure inside the engine or the drafter process: shown, never a traceback
            raise gr.Error(f"serving failed: {e.__class__.__name__}: {e}")
    return go.click(run, [n, b, m, r], [gantt, prog, lat, info], concurrency_limit=1, concurrency_id="device",
             api_name="serving")


def inspector_tab(run_state: gr.State, gen_ev) -> None:
    with gr.Tab("Step inspector", id="tab-inspect"):
        with gr.Row():
            with gr.Column(scale=3):
                step = gr.Slider(0, 200, value=0, step=1, label="step of the last Generate run (opens on the step "
                                 "whose draft landed the most tokens, neural first)",
                                 elem_id="inspect-step")
                view = gr.HTML(elem_id="inspect-view")
            with gr.Column(scale=2):
                gr.Markdown(handlers.EXPLANATION)
    gen_ev.then(handlers.inspect_last_run, run_state, [step, view], queue=False)
    step.change(lambda st, s: handlers.explain_step(st, s), [run_state, step], view, queue=False)


def build_demo(res: Resources) -> gr.Blocks:
    with gr.Blocks(title="SwitchSD Studio") as demo:
        model_status, precision = _header(res)
        chat, run_state, gen_ev, empty_plots, plot_outputs = generate_tab(res, precision, model_status)
        race_tab(res, precision, chat, model_status)
        probe_ev = probe_lab_tab(res, model_status)
        inspector_tab(run_state, gen_ev)
        pareto, lab_ev = verification_lab_tab(res)
        serving_ev = serving_tab(res)
        for ev in (probe_ev, lab_ev, serving_ev):        # the header says what is loaded after any run
            ev.then(lambda: res.status(), None, model_status, queue=False)
        demo.load(lambda: plots.plot_value(verifylab.pareto()), None, pareto, queue=False)
        demo.load(empty_plots, None, plot_outputs, queue=False)
        demo.load(res.status, None, model_status, queue=False)        # a page opened after the model loaded
    return demo
