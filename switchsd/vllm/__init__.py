"""SwitchSD inside vLLM (its own environment: `make vllm` builds .venv-vllm with vLLM's CPU build and this plugin).

    copy.py     the copy drafter as a vLLM `custom_class` proposer (`switchsd.vllm.copy.CopyProposer`)
    gate.py     SwitchSD: vLLM's EAGLE-3 proposer behind the gate (SWITCHSD_VLLM_GATE=PROBE)
    costs.py    the gate's cost rule: acceptance by draft position and step time by rows, measured while serving
    methods.py  the speculative methods the benchmarks serve, as vLLM's --speculative-config
    check.py    vLLM loads the plugin; greedy outputs with the copy proposer equal vLLM's without speculation
    cli.py      vLLM's own command line for the CPU build

`register()` is the `vllm.general_plugins` entry point (pyproject.toml): vLLM calls it in every process it starts.
It checks that the running vLLM is the version the plugin was written against (it reads vLLM internals that move
between releases: `INTERNALS`) and fails loudly, naming what moved, if not. Importing this package imports nothing
of vLLM's; `register()` and the modules above do.
"""
from __future__ import annotations

import importlib
import inspect

VLLM_VERSION = "0.32.0"
# (module, attribute) pairs this plugin relies on; `check_internals` names any that moved
INTERNALS = (
    ("vllm.v1.spec_decode.custom_class_proposer", "create_custom_proposer"),
    ("vllm.config.speculative", "SpeculativeConfig"),
    ("vllm.logger", "init_logger"),
    ("vllm.v1.spec_decode.eagle", "EagleProposer"),
)
# the leading parameters of EagleProposer.propose that gate.py passes on by position
PROPOSE_PARAMS = ("self", "num_speculative_tokens", "target_token_ids", "target_positions", "target_hidden_states",
                  "next_token_ids", "token_indices_to_sample", "common_attn_metadata", "sampling_metadata",
                  "mm_embed_inputs", "num_rejected_tokens_gpu")
INIT_PARAMS = ("self", "vllm_config", "device", "runner")     # EagleProposer.__init__: the runner, third


class VllmVersionError(RuntimeError):
    pass


def check_internals() -> list[str]:
    """The (module.attribute) names of INTERNALS that this vLLM lacks (empty: all present)."""
    missing = []
    for module, attr in INTERNALS:
        try:
            if not hasattr(importlib.import_module(module), attr):
                missing.append(f"{module}.{attr}")
        except ImportError:
            missing.append(f"{module}.{attr}")
    if not missing:
        from vllm.v1.spec_decode.eagle import EagleProposer
        for name, want in (("__init__", INIT_PARAMS), ("propose", PROPOSE_PARAMS)):
            params = tuple(inspect.signature(getattr(EagleProposer, name)).parameters)
            if params[:len(want)] != want:
                missing.append(f"vllm.v1.spec_decode.eagle.EagleProposer.{name}{want[1:]} (now {params[1:]})")
    return missing


def register() -> None:
    import vllm
    version = getattr(vllm, "__version__", "?")
    if not version.startswith(VLLM_VERSION):
        raise VllmVersionError(f"switchsd's vLLM plugin is pinned to vllm {VLLM_VERSION}; this is {version} "
                               f"(rebuild with `make vllm`)")
    missing = check_internals()
    if missing:
        raise VllmVersionError(f"vLLM {version} lacks what switchsd's plugin uses: {', '.join(missing)}")
    from switchsd import envs

    from .gate import ENV, install
    if envs.get(ENV):
        install(envs.get(ENV))
