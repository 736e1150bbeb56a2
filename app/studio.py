"""The studio's layout and handlers. `build_demo(resources)` returns a gr.Blocks (no server started)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import gradio as gr
import torch

from types import SimpleNamespace

from switchsd.calibrate import load_budget
from switchsd.cli_common import Neural, build_engine
from switchsd.config import CopyConfig, EngineConfig, SamplingConfig
from switchsd.events import summarize
from switchsd.methods import METHODS
from switchsd.models import LoadedModel, load_model

from .render import tokens_html

PRESETS = {
    "JSON echo (copy-heavy)": 'Repeat this JSON exactly, then stop: {"name": "Alice", "age": 30, "city": "Paris", '
                              '"skills": ["python", "sql", "statistics"], "active": true}',
    "Accidental repetition (math)": "Let n be a positive integer. Show that n^2 + n is even, using n = 2k and n = 2k + 1.",
    "Free-form story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}
MAX_PROMPT_CHARS = 20000


@dataclass
class Resources:
    """Models load once, lazily, behind a lock."""
    model_name: str | None = None
    dtype: str = "auto"
    device: str | None = None
    eagle: str = "auto"
    draft: str | None = None
    _lm: LoadedModel | None = None
    _neural: Neural | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def lm(self) -> LoadedModel:
        with self._lock:
            if self._lm is None:
                self._lm = load_model(self.model_name, self.dtype, self.device)
                opts = SimpleNamespace(eagle=self.eagle, draft=self.draft, neural="eagle3", chain=False, gamma=5,
                                       tree_topk=4, tree_depth=5, tree_tokens=24)
                self._neural = Neural(opts, self._lm)
            return self._lm

    def neural(self) -> Neural:
        self.lm()
        return self._neural


def generate_stream(res: Resources, prompt: str, method: str, temperature: float, max_new_tokens: int,
                    chat: bool):
    if not prompt or not prompt.strip():
        raise gr.Error("The prompt is empty.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise gr.Error(f"The prompt is longer than {MAX_PROMPT_CHARS} characters.")
    if method not in METHODS:
        raise gr.Error(f"Unknown method {method!r}.")
    yield "", "Loading the model (first run only)…"
    try:
        lm = res.lm()
    except Exception as e:  # shown in the UI, never as a traceback
        raise gr.Error(f"Could not load the model: {e}")
    ids = lm.encode(prompt, chat=chat)
    if len(ids) >= lm.max_length:
        raise gr.Error(f"The prompt has {len(ids)} tokens; the model's context is {lm.max_length}.")
    budget, _ = load_budget(lm)
    try:
        cfg = EngineConfig(max_new_tokens=int(max_new_tokens), budget=budget,
                           sampling=SamplingConfig(temperature=float(temperature)))
    except ValueError as e:
        raise gr.Error(str(e))
    try:
        engine = build_engine(method, lm, cfg, CopyConfig(), res.neural())
    except SystemExit as e:  # the CLI builders report problems as SystemExit("error: ...")
        raise gr.Error(str(e).removeprefix("error: "))
    events, t0, last = [], time.perf_counter(), 0.0
    try:
        for e in engine.generate(ids, torch.Generator().manual_seed(0)):
            events.append(e)
            now = time.perf_counter()
            if now - last > 0.25 or e.finished:  # refresh a few times a second, not per token
                last = now
                s = summarize(events, now - t0)
                yield tokens_html(lm.tokenizer, events), _status(s)
    finally:
        engine.close()


def _status(s: dict) -> str:
    paths = ", ".join(f"{k} {v['pct']:.0f}% (MAL {v['mal']:.2f})" for k, v in s["paths"].items())
    return (f"{s['new_tokens']} tokens · {s['steps']} target forwards · tau {s['tau']:.2f} · "
            f"{s['tok_s']:.1f} tok/s · {paths}")


def build_demo(res: Resources) -> gr.Blocks:
    with gr.Blocks(title="SwitchSD Studio") as demo:
        gr.Markdown("# SwitchSD Studio\nSpeculative decoding that copies from the context when the model "
                    "intends to copy. Tokens are coloured by the path that drafted them.")
        with gr.Tab("Generate"):
            with gr.Row():
                with gr.Column(scale=2):
                    preset = gr.Dropdown(list(PRESETS), label="Preset", value=None)
                    prompt = gr.Textbox(label="Prompt", lines=5, elem_id="prompt",
                                        value=PRESETS["JSON echo (copy-heavy)"])
                with gr.Column(scale=1):
                    method = gr.Dropdown(list(METHODS), value="copy", label="Method")
                    temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature")
                    max_new = gr.Slider(1, 1024, value=128, step=1, label="Max new tokens")
                    chat = gr.Checkbox(value=True, label="Chat template")
                    with gr.Row():
                        run = gr.Button("Generate", variant="primary", elem_id="run")
                        stop = gr.Button("Stop", elem_id="stop")
            status = gr.Markdown(elem_id="status")
            tokens = gr.HTML(elem_id="tokens-box")
        preset.change(lambda p: PRESETS.get(p, gr.skip()), preset, prompt, queue=False)
        ev = run.click(lambda *a: (yield from generate_stream(res, *a)),
                       [prompt, method, temperature, max_new, chat], [tokens, status],
                       concurrency_limit=1, concurrency_id="device", api_name="generate")
        stop.click(None, cancels=[ev], queue=False)
    return demo
