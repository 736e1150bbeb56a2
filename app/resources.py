"""Models, drafters and probes the studio uses: loaded once, lazily, behind a lock; engines are built per run."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from switchsd.calibrate import load_budget
from switchsd.cli_common import DEFAULT_HEADS, DEFAULT_PROBES, Neural, build_engine
from switchsd.config import CopyConfig, EngineConfig, SamplingConfig
from switchsd.engine import Engine
from switchsd.models import DEFAULT_MODEL, LoadedModel, load_model
from switchsd.probe import Probe, ProbeError, load_probe

from .worker import TorchThread

PROBE_DIR = Path(__file__).resolve().parents[1] / "probes"


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
    _lm: LoadedModel | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _probes: dict = field(default_factory=dict)
    _neural: Neural | None = None
    worker: TorchThread = field(default_factory=TorchThread)   # every torch computation runs on this thread

    @property
    def loaded(self) -> bool:
        return self._lm is not None

    def lm(self) -> LoadedModel:
        with self._lock:
            if self._lm is None:
                self._lm = self.worker.call(load_model, self.model_name, self.dtype, self.device)
            return self._lm

    def default_method(self) -> str:
        """switchsd when its probe and EAGLE3 head are at hand for the default setup, else the copy path."""
        name = self.model_name or DEFAULT_MODEL
        head = self.eagle != "auto" or (DEFAULT_HEADS.get(name) is not None and DEFAULT_HEADS[name].exists())
        probe = self.probe != "auto" or (DEFAULT_PROBES.get(name) is not None and DEFAULT_PROBES[name].exists())
        return "switchsd" if head and probe else "copy"

    def status(self) -> str:
        if self._lm is None:
            return "model not loaded yet (loads on the first run)"
        lm = self._lm
        return f"{lm.name} · {lm.device} · {str(lm.dtype).replace('torch.', '')}"

    def neural(self, **overrides) -> Neural:
        """The drafters' weights load once (first use); each engine gets a view with its own options."""
        lm = self.lm()
        if self._neural is None:
            opts = dict(eagle=self.eagle, draft=self.draft, neural="eagle3", chain=False, gamma=5, tree_topk=4,
                        tree_depth=5, tree_tokens=24, probe=self.probe, tau=None, bandit_c=1.0)
            self._neural = Neural(SimpleNamespace(**opts), lm)     # weights load lazily, in build_engine
        return self._neural.with_overrides({k: v for k, v in overrides.items() if v is not None})

    def engine(self, method: str, max_new_tokens: int, temperature: float = 0.0, tau: float | None = None,
               kappa: int = 5, width: int = 10, depth: int = 20, gamma: int | None = None) -> Engine:
        lm = self.lm()
        try:
            cfg = EngineConfig(max_new_tokens=int(max_new_tokens), budget=load_budget(lm)[0],
                               sampling=SamplingConfig(temperature=float(temperature)))
            copy = CopyConfig(kappa=int(kappa), max_candidates=int(width), max_draft_len=int(depth))
        except ValueError as e:
            raise UserError(str(e)) from None
        chain = gamma is not None and int(gamma) > 0
        neural = self.neural(tau=tau, chain=chain or None, gamma=int(gamma) if chain else None)
        try:
            return self.worker.call(build_engine, method, lm, cfg, copy, neural)
        except SystemExit as e:  # the shared builders report setup problems as SystemExit("error: ...")
            raise UserError(str(e).removeprefix("error: ")) from None

    # -- probes ---------------------------------------------------------------------------------------------
    def shipped_probes(self) -> list[str]:
        return sorted(str(p.relative_to(PROBE_DIR.parent)) for p in PROBE_DIR.glob("*.safetensors"))

    def load_probe(self, path: str) -> Probe:
        if not path:
            raise UserError("choose a probe file")
        key = str(path)
        if key not in self._probes:
            p = Path(path)
            if not p.is_absolute():
                p = PROBE_DIR.parent / p
            try:
                self._probes[key] = self.worker.call(load_probe, p, self.lm().model)
            except ProbeError as e:
                raise UserError(str(e)) from None
        return self._probes[key]

    def default_probe_path(self) -> str | None:
        p = DEFAULT_PROBES.get(self.lm().name) if self._lm is not None else None
        return str(p) if p is not None and p.exists() else None
