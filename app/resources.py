"""Models, drafters and probes the studio uses: loaded once, lazily, behind a lock; engines are built per run
through the library's factory (switchsd.factory), with the defaults of switchsd.core.config."""
from __future__ import annotations

import gc
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from switchsd.core.config import CopyConfig, EngineConfig, GateConfig, NeuralConfig, SamplingConfig
from switchsd.core.engine import Engine
from switchsd.core.probe import Probe, ProbeError, load_probe
from switchsd.factory import DEFAULT_HEADS, DEFAULT_PROBES, Drafters, SetupError, build_engine, shipped_for
from switchsd.models.calibrate import load_budget
from switchsd.models.loading import DEFAULT_MODEL, LoadedModel, auto_device, gguf_model, gguf_path, load_model

from .worker import TorchThread

PROBE_DIR = Path(__file__).resolve().parents[1] / "probes"
MAX_PROMPT_CHARS = 20000       # every tab checks its text against this before tokenising it


def settle_heap() -> None:
    """Collect, then exempt every object alive now (the app, the model) from Python's cyclic GC: a full
    collection over the studio's ~500k objects holds the GIL for 80-270 ms, which landed inside runs of a few
    hundred ms (their Tok/s fell by up to a third). Later collections scan only the objects made since."""
    gc.collect()
    gc.freeze()


class UserError(ValueError):
    """A problem with the user's input or setup; its message is shown in the UI as is."""


@dataclass
class Resources:
    model_name: str | None = None
    dtype: str = "auto"
    device: str | None = None
    eagle: str = "auto"
    draft: str | None = None
    probe: str = "auto"
    forward: str = EngineConfig.forward     # the target's forward: auto | lean | hf
    _lms: dict = field(default_factory=dict)         # dtype choice ("auto" | "float32") -> LoadedModel
    _drafters: dict = field(default_factory=dict)
    _vanilla: OrderedDict = field(default_factory=OrderedDict)   # greedy vanilla runs, for speedups / badges
    _probes: dict = field(default_factory=dict)
    _trained: dict = field(default_factory=dict)     # probes trained in the Probe lab: name -> path
    worker: TorchThread = field(default_factory=TorchThread)   # every torch computation runs on this thread

    @property
    def loaded(self) -> bool:
        return bool(self._lms)

    def lm(self, dtype: str | None = None) -> LoadedModel:
        """The target in the studio's dtype (`--dtype`, default auto: the fastest here) or, on request,
        float32 (token-for-token identical to vanilla). Loads happen on the torch thread, one at a time, and
        no lock is held while waiting for it (a job already on that thread may itself ask for the model)."""
        key = dtype if dtype in ("float32", "int4", "q4q8") else self.dtype
        if key in ("int4", "q4q8") and key not in self.four_bit_formats():
            raise UserError(f"{key} runs a GGUF model's own 4-bit weights on CPU: not available for this model/device")
        lm = self._lms.get(key)
        return lm if lm is not None else self.worker.call(self._load, key)

    def _load(self, key: str) -> LoadedModel:      # runs on the torch thread
        if key not in self._lms:
            self._lms[key] = load_model(self.model_name, key, self.device)
            settle_heap()
        return self._lms[key]

    def four_bit_formats(self) -> list[str]:
        """The 4-bit formats of a GGUF model (the offline default or a .gguf file) on CPU: q4q8 where its C kernels
        build, int4 where torch has its int4 kernel."""
        from switchsd.kernels.build import available
        from switchsd.models import int4
        from switchsd.models.loading import ModelLoadError, readable_formats
        if not gguf_model(self.model_name) or (self.device or auto_device()) != "cpu":
            return []
        try:
            reads = readable_formats(gguf_path(self.model_name))
        except ModelLoadError:
            return []
        return (["q4q8"] if available("llama") and "q4q8" in reads else []) + \
            (["int4"] if int4.available() and "int4" in reads else [])

    def _shipped(self, kind: str):
        """The shipped probe / head: by fingerprint once the model is loaded, by name before."""
        if self._lms:
            return shipped_for(next(iter(self._lms.values())), kind)
        path = (DEFAULT_HEADS if kind == "eagle3" else DEFAULT_PROBES).get(self.model_name or DEFAULT_MODEL)
        return path if path is not None and path.exists() else None

    def default_method(self) -> str:
        """switchsd when its probe and EAGLE3 head are at hand for the default setup, else the copy path."""
        head = self.eagle != "auto" or self._shipped("eagle3") is not None
        probe = self.probe != "auto" or self._shipped("probe") is not None
        return "switchsd" if head and probe else "copy"

    def status(self) -> str:
        """The header line: model, device, the formats loaded, and the probe and EAGLE-3 head in use (or that
        will be, on first use)."""
        name = self.model_name or DEFAULT_MODEL
        probe = _short(self.probe if self.probe != "auto" else self._shipped("probe"))
        head = _short(self.eagle if self.eagle != "auto" else self._shipped("eagle3"))
        loaded = {k for d in self._drafters.values() for k in d._loaded}
        parts = [f"probe {probe}" + ("" if "probe" in loaded or probe == "none" else " (loads on first use)"),
                 f"EAGLE-3 head {head}" + ("" if "head" in loaded or head == "none" else " (loads on first use)")]
        if not self._lms:
            return f"**{_short(name)}** · not loaded yet (loads on the first run) · " + " · ".join(parts)
        lm = next(iter(self._lms.values()))
        dts = ", ".join(sorted(m.precision for m in self._lms.values()))
        return f"**{_short(lm.name)}** · {lm.device} · format {dts} · " + " · ".join(parts)

    def drafters(self, lm: LoadedModel) -> Drafters:
        """The drafters' weights load once per model copy (first use)."""
        key = lm.precision
        if key not in self._drafters:
            self._drafters[key] = Drafters(lm, self.eagle, self.draft, self.probe)
        return self._drafters[key]

    def engine(self, method: str, max_new_tokens: int, temperature: float = 0.0, tau: float | None = None,
               kappa: int = 0, width: int = CopyConfig.max_candidates,
               depth: int = CopyConfig.max_draft_len, gamma: int | None = None, dtype: str | None = None,
               verify: str = EngineConfig.verify) -> Engine:
        """`gamma` > 0: a fixed neural chain of that length; None / 0: the default shape (NeuralConfig). `kappa` 0:
        each path's default, as on the command line (the cost gate's GateConfig.kappa, the copy drafter's
        CopyConfig.kappa)."""
        for name, v in (("max new tokens", max_new_tokens), ("temperature", temperature), ("tau", tau),
                        ("kappa", kappa), ("W", width), ("D", depth), ("gamma", gamma)):
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise UserError(f"{name} must be a finite number, got {v!r}")
        lm = self.lm(dtype)
        try:
            cfg = EngineConfig(max_new_tokens=int(max_new_tokens), budget=load_budget(lm, forward=self.forward)[0],
                               sampling=SamplingConfig(temperature=float(temperature)), forward=self.forward,
                               verify=verify)
            copy_cfg = CopyConfig(kappa=int(kappa) or CopyConfig.kappa, max_candidates=int(width), max_draft_len=int(depth))
            neural = NeuralConfig(shape="chain", gamma=int(gamma)) if gamma and int(gamma) > 0 else NeuralConfig()
            gate = GateConfig(tau=None if tau is None else float(tau), kappa=int(kappa) or GateConfig.kappa)
        except (TypeError, ValueError) as e:
            raise UserError(str(e)) from None
        try:
            return self.worker.call(build_engine, method, lm, self.drafters(lm), cfg, copy_cfg, neural, gate)
        except SetupError as e:
            raise UserError(str(e)) from None

    def remember_vanilla(self, key: tuple, token_ids: list[int], tok_s: float) -> None:
        self._vanilla[key] = (list(token_ids), float(tok_s))
        self._vanilla.move_to_end(key)
        while len(self._vanilla) > 64:
            self._vanilla.popitem(last=False)

    def vanilla_run(self, key: tuple) -> tuple[list[int], float] | None:
        return self._vanilla.get(key)

    # -- probes ---------------------------------------------------------------------------------------------
    def shipped_probes(self) -> list[str]:
        """The lab's choices: the shipped probes, then those trained here."""
        return sorted(str(p.relative_to(PROBE_DIR.parent)) for p in PROBE_DIR.glob("*.safetensors")) + \
            list(self._trained)

    def add_trained(self, name: str, path: Path, probe: Probe) -> None:
        """A probe trained in the lab: one of the lab's choices, and the probe of the next Generate run."""
        self._trained[name] = path
        self._probes[name] = probe
        self.probe = str(path)
        self._drafters.clear()                      # the next run builds its drafters with the new probe

    def load_probe(self, name: str) -> Probe:
        """A shipped probe, by the name the dropdown shows. Nothing else on the server is readable through
        this: any other name gets the same refusal, whether or not such a file exists."""
        if not name:
            raise UserError("choose a probe file")
        if name not in self.shipped_probes():
            raise UserError(f"unknown probe {str(name)[:80]!r}: choose one of the shipped probes or upload a "
                            ".safetensors probe")
        if name not in self._probes:
            self._probes[name] = self._read_probe(self._trained.get(name) or PROBE_DIR.parent / name)
        return self._probes[name]

    def load_upload(self, path: str) -> Probe:
        """A probe the visitor uploaded (Gradio's upload folder, size-capped at launch). Not cached: the lab's
        session state keeps the scores, never the probe. An API client can name any path in its FileData: only
        files inside the upload folder are read, whatever else exists on the server."""
        from gradio.utils import get_upload_folder
        folder = Path(get_upload_folder()).resolve()
        try:
            real = Path(str(path)).resolve()
        except (OSError, RuntimeError, ValueError):
            real = None
        if real is None or not real.is_relative_to(folder) or not real.is_file():
            raise UserError("that is not an uploaded file: upload a .safetensors probe with the file box")
        return self._read_probe(real)

    def _read_probe(self, path: Path) -> Probe:
        try:
            return self.worker.call(load_probe, path, self.lm().model)
        except ProbeError as e:
            raise UserError(str(e).replace(str(path.parent) + "/", "")) from None


def _short(path) -> str:
    """A file or folder as the header names it (its last part), or 'none'."""
    return "none" if path is None else Path(str(path)).name or str(path)
