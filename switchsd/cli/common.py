"""Arguments shared by the command-line entry points, and their translation into the library's configs.

Every default is read from the config dataclasses (switchsd/core/config.py); engines are built by
switchsd.factory. Library errors become one-line `error: ...` exits here, and only here.
"""
from __future__ import annotations

import argparse
import sys

from ..core.config import (
    GATE_MODES,
    NEURAL_SHAPES,
    CopyConfig,
    EngineConfig,
    GateConfig,
    NeuralConfig,
    SamplingConfig,
    SMCConfig,
    TreeConfig,
)
from ..core.engine import Engine
from ..core.rules import RULES
from ..factory import Drafters, SetupError
from ..factory import build_engine as _build_engine
from ..factory import parse_method as _parse_method
from ..methods import NEURAL_METHODS
from ..models.calibrate import DEFAULT_RATIO, load_budget
from ..models.forward import FORWARDS
from ..models.loading import LoadedModel, ModelLoadError, load_model

_C, _N, _T, _G, _E, _S = CopyConfig(), NeuralConfig(), TreeConfig(), GateConfig(), EngineConfig(), SamplingConfig()
_M = SMCConfig()
LOSSLESS_NOTE = ("note: {dtype} — every method verifies against the target as computed in {dtype}; on CPU each "
                 "row of a verify forward is computed as vanilla's one-row step would (trees up to 16 rows, chains "
                 "up to 32), but in wider forwards, or on a GPU, two nearly tied tokens can round differently, so "
                 "texts may part from vanilla's at such a near-tie. --dtype float32 gives token-for-token identity "
                 "with vanilla greedy decoding.")
Q4Q8_NOTE = ("note: q4q8 — every method verifies against the target as computed in q4q8, whose forward computes "
             "every row alone (any width): each method's text equals q4q8 vanilla's token for token. --dtype "
             "float32 gives identity with float32 vanilla greedy decoding.")


def add_model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="HF id or local folder (default: offline SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default="auto",
                    help="auto (the fastest for decoding here: CUDA bfloat16; CPU what `switchsd calibrate` measured over "
                         "the whole verify curve, else q4q8 for a 4-bit GGUF model where a C compiler is present, "
                         "else bfloat16 with native bf16, else float32) | float32 "
                         "(token-for-token identical to vanilla) | bfloat16 | int4 (CPU, GGUF models: the file's own "
                         "4-bit groups, bfloat16 activations) | int4-float32 (the same, float32 activations) | "
                         "int4-mixed (int4 for steps of up to 4 rows, wider verify forwards dense) | q4q8 (CPU, GGUF "
                         "models: 4-bit weights x 8-bit activation blocks, llama.cpp's arithmetic, each forward one "
                         "C call; every verify row is a one-row step bit for bit)")
    ap.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA when present)")
    ap.add_argument("--device-map", default=None, help="'auto' to shard over several GPUs with accelerate")
    ap.add_argument("--forward", choices=FORWARDS, default=_E.forward,
                    help="the target's forward: auto (the lean forward for Llama/Mistral/Qwen2, else "
                         "transformers'), lean, hf (transformers' own; same numbers, slower)")


def add_decode_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--max-new-tokens", type=int, default=_E.max_new_tokens)
    ap.add_argument("--temperature", type=float, default=_S.temperature, help="0: greedy")
    ap.add_argument("--top-k", type=int, default=_S.top_k, help="0: off")
    ap.add_argument("--top-p", type=float, default=_S.top_p, help="1.0: off")
    ap.add_argument("--verify", default=_E.verify, metavar="RULE[:k=v,...]",
                    help=f"verification rule at T > 0: {', '.join(RULES)} (every rule but lossless is LOSSY: its "
                         "output is not the target's distribution; see switchsd/core/rules.py)")
    ap.add_argument("--budget", default="auto",
                    help="most tokens verified per target forward; 'auto' = from the calibrated cost curve")
    ap.add_argument("--budget-ratio", type=float, default=DEFAULT_RATIO,
                    help="with --budget auto: largest n whose forward costs <= ratio x a one-token forward")
    ap.add_argument("--kappa", type=int, default=None,
                    help=f"copy path: n-gram length that must match (default {_G.kappa} with the cost gate, "
                         f"{_C.kappa} elsewhere: the paper's)")
    ap.add_argument("--copy-candidates", type=int, default=_C.max_candidates, help="copy path: W, most candidates")
    ap.add_argument("--copy-len", type=int, default=_C.max_draft_len, help="copy path: D, most tokens per candidate")


def add_neural_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--eagle", default="auto", help="EAGLE3 head: folder or HF id ('auto': the shipped head "
                    "for the offline default model)")
    ap.add_argument("--draft", default=None, help="SPS draft model (HF id or folder) sharing the tokenizer")
    ap.add_argument("--neural", default="eagle3", choices=NEURAL_METHODS,
                    help="the neural drafter copyspec falls back to")
    ap.add_argument("--probe", default="auto", help="copy-intent probe (.safetensors); 'auto': the shipped one")
    ap.add_argument("--tau", type=float, default=_G.tau, help="probe threshold (default: the probe's own)")
    ap.add_argument("--gate", default=_G.mode, choices=GATE_MODES,
                    help="SwitchSD gate: cost (default: copy / neural shape / plain step by expected tokens per "
                         "second on this device) or paper (the fixed dual gate, eq. 4; = method switchsd-paper)")
    ap.add_argument("--bandit-c", type=float, default=_G.bandit_c, help="BanditSpec UCB exploration constant")
    ap.add_argument("--shape", default=_N.shape, choices=NEURAL_SHAPES,
                    help="neural drafting shape: auto (cost-chosen chain length, EAGLE's tree under fixed "
                         "policies), chain (--gamma tokens), tree (--tree-*)")
    ap.add_argument("--chain", action="store_true", help="same as --shape chain")
    ap.add_argument("--gamma", type=int, default=_N.gamma, help="chain length (the longest, with --shape auto)")
    ap.add_argument("--tree-topk", type=int, default=_T.top_k)
    ap.add_argument("--tree-depth", type=int, default=_T.depth)
    ap.add_argument("--tree-tokens", type=int, default=_T.total_tokens, help="draft nodes per tree (capped by the budget)")
    ap.add_argument("--particles", type=int, default=_M.n_particles, help="smc: particles (or the variant smc+pN)")
    ap.add_argument("--ess-threshold", type=float, default=_M.ess_threshold,
                    help="smc: resample when ESS < this fraction of the particles (0: never)")


def fail(msg: str) -> "SystemExit":
    return SystemExit(f"error: {msg}")


def load_prompt_file(args, limit: int | None = None, category: str | None = None) -> list[dict]:
    """`--dataset` / `--data-file`'s prompts, or one `error: ...` line (a malformed file names its row)."""
    from ..eval.datasets import load_prompts
    try:
        return load_prompts(args.dataset, args.data_file, limit, category)
    except (ValueError, FileNotFoundError) as e:
        raise fail(str(e)) from None


class Neural:
    """The CLI's drafters (weights loaded once, see factory.Drafters) plus the drafting options of its flags."""

    def __init__(self, args, lm: LoadedModel):
        self.args, self.lm = args, lm
        self.drafters = Drafters(lm, getattr(args, "eagle", "auto"), getattr(args, "draft", None),
                                 getattr(args, "probe", "auto"))

    def configs(self) -> tuple[NeuralConfig, GateConfig]:
        a = self.args
        shape = "chain" if getattr(a, "chain", False) else getattr(a, "shape", _N.shape)
        try:
            tree = TreeConfig(getattr(a, "tree_topk", _T.top_k), getattr(a, "tree_depth", _T.depth),
                              getattr(a, "tree_tokens", _T.total_tokens))
            return (NeuralConfig(shape=shape, gamma=getattr(a, "gamma", _N.gamma), tree=tree),
                    GateConfig(mode=getattr(a, "gate", _G.mode), tau=getattr(a, "tau", None),
                               kappa=getattr(a, "kappa", None) or _G.kappa, bandit_c=getattr(a, "bandit_c", _G.bandit_c)))
        except ValueError as e:
            raise fail(str(e)) from None

    def smc(self) -> SMCConfig:
        try:
            return SMCConfig(n_particles=getattr(self.args, "particles", _M.n_particles),
                             ess_threshold=getattr(self.args, "ess_threshold", _M.ess_threshold))
        except ValueError as e:
            raise fail(str(e)) from None

    @property
    def probe(self):
        try:
            return self.drafters.probe
        except SetupError as e:
            raise fail(str(e)) from None


def load(args) -> LoadedModel:
    """Load the model, turning a load failure into a one-line error instead of a traceback."""
    try:
        lm = load_model(args.model, args.dtype, args.device, args.device_map)
    except (ModelLoadError, ValueError) as e:
        raise fail(str(e)) from None
    if lm.precision == "q4q8":
        print(Q4Q8_NOTE, file=sys.stderr)
    elif lm.precision != "float32":
        print(LOSSLESS_NOTE.format(dtype=lm.precision), file=sys.stderr)
    return lm


def resolve_budget(args, lm: LoadedModel) -> tuple[int, str]:
    if str(args.budget) == "auto":
        return load_budget(lm, args.budget_ratio, getattr(args, "forward", _E.forward))
    try:
        b = int(args.budget)
    except ValueError:
        raise fail(f"--budget must be an integer or 'auto', got {args.budget!r}") from None
    if b < 1:
        raise fail("--budget must be >= 1")
    return b, "flag"


def engine_config(args, budget: int) -> EngineConfig:
    try:
        return EngineConfig(max_new_tokens=args.max_new_tokens, budget=budget,
                            sampling=SamplingConfig(args.temperature, args.top_k, args.top_p),
                            forward=getattr(args, "forward", _E.forward), verify=getattr(args, "verify", _E.verify))
    except ValueError as e:
        raise fail(str(e)) from None


def copy_config(args) -> CopyConfig:
    try:
        return CopyConfig(kappa=args.kappa or _C.kappa, max_candidates=args.copy_candidates,
                          max_draft_len=args.copy_len)
    except ValueError as e:
        raise fail(str(e)) from None


def parse_method(spec: str) -> tuple[str, dict]:
    try:
        return _parse_method(spec)
    except SetupError as e:
        raise fail(str(e)) from None


def build_engine(method: str, lm: LoadedModel, cfg: EngineConfig, copy_cfg: CopyConfig,
                 neural: Neural | None = None, seed: int = 0) -> Engine:
    """factory.build_engine with the CLI's flags; setup errors exit with one line."""
    n_cfg, g_cfg = neural.configs() if neural is not None else (_N, _G)
    try:
        return _build_engine(method, lm, neural.drafters if neural is not None else Drafters(lm), cfg, copy_cfg,
                             n_cfg, g_cfg, fallback=getattr(neural.args, "neural", "eagle3") if neural else "eagle3",
                             seed=seed, smc=neural.smc() if neural is not None else _M)
    except SetupError as e:
        raise fail(str(e)) from None

