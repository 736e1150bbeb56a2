"""SwitchSD in vLLM: vLLM's own EAGLE-3 proposer with SwitchSD's gate in front of it, per request and step.

    SWITCHSD_VLLM_GATE=probes/smollm2-135m-instruct.safetensors vllm serve MODEL \
        --speculative-config '{"method": "eagle3", "model": "assets/eagle3-smollm2-135m", "num_speculative_tokens": 3}'

With the variable set, the plugin (`switchsd.vllm.register`) wraps two methods of vLLM's `EagleProposer`:
- `load_model(target)`: loads the probe for one of two sites. Layer l's output ("mlp" probe, l + 1 among the
  layers EAGLE-3 captures: by default 2, L/2, L - 3) is read from the features vLLM already hands EAGLE-3, so it
  holds under CUDA graphs and torch.compile; layer l's residual stream after attention ("attn", the shipped probe)
  needs a forward hook (the second output of `layers[l].post_attention_layernorm`, vLLM's fused add-and-norm) that
  writes w . h for every token of each target forward into one persistent buffer: eager mode only;
- `propose(...)`: EAGLE-3 drafts every request as vLLM would; then a request whose last verified token scores
  probe >= tau AND whose last kappa tokens occurred earlier in its context (`copy.copy_chain`) takes the copy chain
  instead, written over its EAGLE-3 draft (the copy's tokens, then EAGLE-3's where the copy is shorter).
vLLM's rejection sampler is untouched, and the drafts are point masses (EAGLE-3's greedy draft sampling, which
the gate requires), so every output is what vLLM samples without speculation. Per-path counts (copy / neural,
tokens drafted, the probe and gate's share of the step time) are logged every LOG_EVERY steps beside vLLM's own
acceptance metrics. Checked on vLLM's CPU build in eager mode; CUDA is not verified here.
"""
from __future__ import annotations

import functools
import os
import time

import numpy as np
import torch

from .copy import KAPPA, LOGGER, copy_chain, write_counts

ENV = "SWITCHSD_VLLM_GATE"
LOG_EVERY = 200


class GateError(ValueError):
    pass


def load_gate_probe(path: str, hidden_size: int, num_layers: int):
    """The probe at `path`, refused with one line unless it fits a target of this shape."""
    from switchsd.core.probe import ProbeError, load_probe
    try:
        probe = load_probe(path)
    except (ProbeError, OSError) as e:
        raise GateError(f"{ENV}={path}: {e}") from None
    if probe.weight.numel() != hidden_size or not 0 <= probe.layer < num_layers:
        raise GateError(f"{path}: probe for hidden size {probe.weight.numel()} at layer {probe.layer}; the served "
                        f"model has hidden size {hidden_size} and {num_layers} layers")
    return probe


class Gate:
    """The probe's per-token logits (filled by a hook during each target forward) and the per-request choice."""
    _last: "Gate | None" = None              # the latest gate in this process (its counts: last_counts)

    def __init__(self, probe, target, max_tokens: int, kappa: int = KAPPA):
        self.w = probe.weight.float()
        self.tau, self.kappa, self.layer = float(probe.tau), kappa, probe.layer
        self.target = target
        self.logits = torch.zeros(max_tokens)                  # [tokens of the last target forward]
        self.aux: int | None = None                            # EAGLE-3 feature block the probe reads (mlp site)
        self.counts = {"steps": 0, "copy": 0, "neural": 0, "copy_tokens": 0,
                       "accepted": {"copy": 0, "neural": 0}, "verified": {"copy": 0, "neural": 0},
                       "gate_s": 0.0, "period_s": 0.0}   # the probe and gate's time; engine steps' time (< 1 s apart)
        self.last_call = None
        self.previous: dict[str, tuple[str, int]] = {}        # request id -> (its last draft's path, tokens then)
        self.calls = 0
        Gate._last = self
        self.sublayer = probe.sublayer
        if probe.sublayer == "attn":           # after attention: a hook (eager mode only)
            target.model.layers[probe.layer].post_attention_layernorm.register_forward_hook(self._read)

    def scores(self, last: torch.Tensor, features: torch.Tensor) -> list[float]:
        """Probe probabilities of each request's last verified token. last [B]: rows of the target forward;
        features [T, n x d]: the layer outputs EAGLE-3 captured (vLLM's aux hidden states, concatenated). An
        "mlp" probe (layer l's output) reads its block there, so nothing runs inside the target's forward and CUDA
        graphs or torch.compile change nothing; an "attn" probe reads the hook's buffer."""
        t = time.perf_counter()
        if self.sublayer == "attn":
            logits = self.logits[last.cpu().long()]
        else:
            if self.aux is None:
                self.aux = aux_block(self.layer, aux_layers(self.target))
            d = self.w.numel()
            h = features[last.long(), self.aux * d:(self.aux + 1) * d]                # [B, d]
            logits = (h.float() @ self.w.to(h.device)).cpu()
        self.counts["gate_s"] += time.perf_counter() - t
        return torch.sigmoid(logits).tolist()

    @classmethod
    def last_counts(cls) -> dict | None:
        if cls._last is None:
            return None
        c = cls._last.counts
        mal = {p: c["accepted"][p] / max(1, c["verified"][p]) for p in ("copy", "neural")}
        return {**c, "mal": mal}

    def _read(self, module, args, output) -> None:
        t = time.perf_counter()
        residual = output[1] if isinstance(output, tuple) else output        # [n, d] after attention
        n = residual.shape[0]
        if n > self.logits.shape[0]:
            self.logits = torch.zeros(n)
        self.logits[:n].copy_(residual.float() @ self.w.to(residual.device))
        self.counts["gate_s"] += time.perf_counter() - t

    def apply(self, drafts: torch.Tensor, scores: list[float], seqs: list[np.ndarray],
              req_ids: list[str], live: list[bool] | None = None) -> torch.Tensor:
        """drafts [B, k] (EAGLE-3's); scores: each request's probe probability (`scores`); seqs: each request's
        committed tokens, this step's included (`committed`); live: False for a request still reading its prompt
        in chunks (vLLM discards its draft; neither drafted nor counted). Also credits each request's previous
        draft with the tokens it committed since (accepted = committed - 1)."""
        t = time.perf_counter()
        if self.last_call is not None and t - self.last_call < 1.0:
            self.counts["period_s"] += t - self.last_call
        self.last_call = t
        k = drafts.shape[1]
        out = None
        for i, s in enumerate(scores):
            if live is not None and not live[i]:
                self.previous.pop(req_ids[i], None)
                continue
            n = len(seqs[i])
            before = self.previous.get(req_ids[i])
            if before is not None and n > before[1]:
                self.counts["verified"][before[0]] += 1
                self.counts["accepted"][before[0]] += n - before[1] - 1
            chain = copy_chain(seqs[i], self.kappa, k) if s >= self.tau else []
            self.previous[req_ids[i]] = ("copy" if chain else "neural", n)
            self.counts["steps"] += 1
            if chain:
                out = drafts.clone() if out is None else out
                out[i, :len(chain)] = torch.tensor(chain, dtype=drafts.dtype)
                self.counts["copy"] += 1
                self.counts["copy_tokens"] += len(chain)
            else:
                self.counts["neural"] += 1
        self.calls += 1
        if len(self.previous) > 4 * len(req_ids) + 64:          # finished requests: forget them
            live = set(req_ids)
            self.previous = {r: v for r, v in self.previous.items() if r in live}
        if self.calls % LOG_EVERY == 0:
            log(self.counts)
        self.counts["gate_s"] += time.perf_counter() - t
        write_counts(self.counts)
        return drafts if out is None else out


def aux_layers(target) -> tuple[int, ...]:
    """The layer ids whose inputs vLLM's EAGLE-3 path captures (id i: the output of layer i - 1)."""
    inner = getattr(target, "model", target)
    layers = getattr(inner, "aux_hidden_state_layers", None)
    if not layers:
        raise GateError("an 'mlp' probe reads EAGLE-3's captured layer outputs, and this target captures none")
    return tuple(int(x) for x in layers)


def aux_block(layer: int, aux: tuple[int, ...]) -> int:
    """Which block of EAGLE-3's concatenated features holds layer `layer`'s output."""
    if layer + 1 not in aux:
        raise GateError(f"the probe reads layer {layer}'s output; EAGLE-3 captures the outputs of layers "
                        f"{[a - 1 for a in aux]} (eagle_aux_hidden_state_layer_ids {list(aux)}): fit the probe on "
                        f"one of those or use an 'attn' probe (eager mode)")
    return aux.index(layer + 1)


def committed(token_ids: np.ndarray, first: np.ndarray, last: np.ndarray, forward_tokens: np.ndarray,
              forward_positions: np.ndarray, next_tokens: np.ndarray) -> list[np.ndarray]:
    """Each request's committed tokens once this step's are in, built from the target forward itself: vLLM calls
    EAGLE-3's propose before it books the step's tokens into `token_ids` (its input batch, [B, max_len]).
    Request i's rows of the forward are first[i]..last[i] (up to its last accepted row) at positions
    forward_positions[first[i]]...; everything before that position is in token_ids already; next_tokens[i] is the
    token sampled after row last[i]."""
    seqs = []
    for i, (a, b) in enumerate(zip(first.tolist(), last.tolist())):
        p0 = int(forward_positions[a])
        seqs.append(np.concatenate([token_ids[i, :p0], forward_tokens[a:b + 1], next_tokens[i:i + 1]]))
    return seqs


def log(counts: dict) -> None:
    from vllm.logger import init_logger
    s, acc, ver = max(1, counts["steps"]), counts["accepted"], counts["verified"]
    init_logger(LOGGER).info(
        "SwitchSD gate: %d request-steps; copy %.1f%% (%.2f tokens drafted, %.2f accepted per step); "
        "neural %.1f%% (%.2f accepted per step); probe and gate %.1f%% of the step time", counts["steps"],
        100 * counts["copy"] / s, counts["copy_tokens"] / max(1, counts["copy"]), acc["copy"] / max(1, ver["copy"]),
        100 * counts["neural"] / s, acc["neural"] / max(1, ver["neural"]),
        100 * counts["gate_s"] / max(1e-9, counts["period_s"]))


def install(probe_path: str) -> None:
    """Wrap vLLM's EagleProposer (load_model, propose) with the gate. Idempotent."""
    from vllm.v1.spec_decode.eagle import EagleProposer
    if getattr(EagleProposer, "_switchsd", False):
        return
    init, load_model, propose = EagleProposer.__init__, EagleProposer.load_model, EagleProposer.propose

    def gated_init(self, vllm_config, device, runner=None, *args, **kwargs):
        init(self, vllm_config, device, runner, *args, **kwargs)
        self._switchsd_runner = runner            # its input batch: the requests' ids and committed tokens

    def gated_load_model(self, target_model, *args, **kwargs):
        load_model(self, target_model, *args, **kwargs)
        spec = self.vllm_config.speculative_config
        if spec.method != "eagle3":
            raise GateError(f"the SwitchSD gate wraps EAGLE-3; this server drafts with {spec.method!r}")
        if getattr(spec, "draft_sample_method", "greedy") != "greedy":
            raise GateError("the SwitchSD gate writes point-mass copy drafts: it needs EAGLE-3's greedy drafting")
        if getattr(spec, "disable_padded_drafter_batch", False):
            raise GateError("the SwitchSD gate reads the probe at the target forward's own rows: it needs vLLM's "
                            "padded drafter batch (drop disable_padded_drafter_batch)")
        hf = self.vllm_config.model_config.hf_config
        probe = load_gate_probe(probe_path, int(hf.hidden_size), int(hf.num_hidden_layers))
        self._switchsd_gate = Gate(probe, target_model, self.vllm_config.scheduler_config.max_num_batched_tokens,
                                   int(os.environ.get("SWITCHSD_KAPPA", KAPPA)))

    def gated_propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                      next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                      *args, **kwargs):
        drafts = propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                         next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                         *args, **kwargs)
        gate = getattr(self, "_switchsd_gate", None)
        if gate is None or drafts.numel() == 0:
            return drafts
        t = time.perf_counter()
        first = common_attn_metadata.query_start_loc[:-1]
        last = token_indices_to_sample
        if last is None:                  # vLLM's own rule: the last scheduled token, less the rejected drafts
            last = common_attn_metadata.query_start_loc[1:] - 1
            rejected = kwargs.get("num_rejected_tokens_gpu", args[1] if len(args) > 1 else None)
            if rejected is not None:
                last = last - rejected
        batch = self._switchsd_runner.input_batch
        positions = target_positions[0] if target_positions.dim() == 2 else target_positions    # M-RoPE: [3, T]
        seqs = committed(batch.token_ids_cpu, first.cpu().numpy(), last.cpu().numpy(), target_token_ids.cpu().numpy(),
                         positions.cpu().numpy(), next_token_ids.cpu().numpy())
        # a request whose forward ended before its prompt's end is reading its prompt in chunks
        live = [len(q) - 1 >= int(p) for q, p in zip(seqs, batch.num_prompt_tokens[:len(seqs)])]
        gate.counts["gate_s"] += time.perf_counter() - t
        return gate.apply(drafts, gate.scores(last, target_hidden_states), seqs, batch.req_ids, live)

    for wrapper, original in ((gated_init, init), (gated_load_model, load_model), (gated_propose, propose)):
        functools.update_wrapper(wrapper, original)            # signatures read through (`check_internals`)
    EagleProposer.__init__, EagleProposer.load_model, EagleProposer.propose = gated_init, gated_load_model, gated_propose
    EagleProposer._switchsd = True
