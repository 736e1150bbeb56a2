"""SwitchSD in vLLM: vLLM's own EAGLE-3 proposer with SwitchSD's gate in front of it, per request and step.

    SWITCHSD_VLLM_GATE=probes/smollm2-135m-instruct.safetensors vllm serve MODEL \
        --speculative-config '{"method": "eagle3", "model": "assets/eagle3-smollm2-135m", "num_speculative_tokens": 5}'

`num_speculative_tokens` caps the copy chains; EAGLE-3 drafts SWITCHSD_NEURAL_K tokens (3). With the variable set,
the plugin (`switchsd.vllm.register`) wraps two methods of vLLM's `EagleProposer`:
- `load_model(target)`: loads the probe for one of two sites. Layer l's output ("mlp" probe, l + 1 among the
  layers EAGLE-3 captures: by default 2, L/2, L - 3) is read from the features vLLM already hands EAGLE-3, so it
  holds under CUDA graphs and torch.compile; layer l's residual stream after attention ("attn", the shipped probe)
  needs a forward hook (the second output of `layers[l].post_attention_layernorm`, vLLM's fused add-and-norm) that
  writes w . h for every token of each target forward into one persistent buffer: eager mode only;
- `propose(...)`: first the gate (`Gate.plan`). A request's copy chain is the continuation of its last kappa
  tokens' earlier occurrence in its own context (`copy.copy_match`, the paper's copy drafter; of its occurrences,
  the one whose preceding context matches longest; where it runs into the present it repeats itself; at most
  SWITCHSD_SPEC_FACTOR = 2 times as long as the context it matched), else of
  the longest context that its own tokens or the requests' outputs continued before (`copy.CopyCounts`). Rule
  "cost" (SWITCHSD_RULE, the default): per request, the copy chain cut to the length, EAGLE-3's draft, or no draft,
  whichever is expected to emit the most tokens per second from what each earned on this server (`PathCosts`:
  acceptance by position per probe state and match length, loops apart, a draft's weight halving every 500 drafts
  verified since, so a path that missed early is tried again; step times by the rows of every request in the step,
  so that where many requests share a step only drafts likely to be accepted pay); the probe's state is
  what splits the copy path's record. Rule "probe" (the paper's): copy when the probe fires AND the kappa-gram
  occurred before, else EAGLE-3. EAGLE-3 runs only for the requests that take it, and not at all when none does
  (its skipped positions stay out of its KV cache: fewer accepted later, never a wrong token). Above
  SWITCHSD_NEURAL_MAX_BATCH running requests (1: on this CPU EAGLE-3 loses from 4 requests on) it does not run and
  a request copies wherever it has a chain. The drafts go back to vLLM as one list per request, of different
  lengths, as vLLM's n-gram drafts do.
vLLM's rejection sampler is untouched, and the drafts are point masses (EAGLE-3's greedy draft sampling, which
the gate requires), so every output is what vLLM samples without speculation. Per-path counts (copy / neural /
none, tokens drafted, accepted per verified draft, read from the target forward's own rows, the probe and gate's
share of the step time) are logged every LOG_EVERY steps beside vLLM's own acceptance metrics. Checked on vLLM's
CPU build in eager mode; CUDA is not verified here.
"""
from __future__ import annotations

import functools
import time

import numpy as np
import torch

from switchsd import envs
from switchsd.core.acceptance import HALF_LIFE

from .copy import LOGGER, SPEC_FACTOR, CopyCounts, copy_path, write_counts
from .costs import PathCosts

ENV = "SWITCHSD_VLLM_GATE"
LOG_EVERY = 200
KAPPA = 2               # the copy path's kappa-gram: its chains are capped by their match (copy.SPEC_FACTOR)
NEURAL_K = envs.VARS["SWITCHSD_NEURAL_K"].default      # EAGLE-3's draft length (num_speculative_tokens caps copies)
NEURAL_MAX_BATCH = envs.VARS["SWITCHSD_NEURAL_MAX_BATCH"].default   # above this many running requests: no EAGLE-3
RULES = ("cost", "probe")


class GateError(ValueError):
    pass


def load_gate_probe(path: str, hidden_size: int, num_layers: int, hf_config=None):
    """The probe at `path`, refused with one line unless it fits a target of this shape (and, with the served
    model's `hf_config`, of this model: `Probe.check`, as the engine checks it)."""
    from types import SimpleNamespace

    from switchsd.core.probe import ProbeError, load_probe
    try:
        probe = load_probe(path)
    except (ProbeError, OSError) as e:
        raise GateError(f"{ENV}={path}: {e}") from None
    if probe.weight.numel() != hidden_size or not 0 <= probe.layer < num_layers:
        raise GateError(f"{path}: probe for hidden size {probe.weight.numel()} at layer {probe.layer}; the served "
                        f"model has hidden size {hidden_size} and {num_layers} layers")
    if hf_config is not None:
        try:
            probe.check(SimpleNamespace(config=hf_config))
        except ProbeError as e:
            raise GateError(f"{path}: {e}") from None
    return probe


class Gate:
    """The probe's per-token logits and each request's path for its next draft, with per-path counts."""
    _last: "Gate | None" = None              # the latest gate in this process (its counts: last_counts)

    def __init__(self, probe, target, max_tokens: int, kappa: int = KAPPA, neural_k: int = NEURAL_K,
                 neural_max_batch: int = NEURAL_MAX_BATCH, rule: str = "cost", backoff: bool = True,
                 half_life: int = HALF_LIFE, factor: int = SPEC_FACTOR):
        self.w = probe.weight.float()
        self.tau, self.kappa, self.layer = float(probe.tau), kappa, probe.layer
        self.factor = factor                                   # a copy chain <= factor x its match (0: no cap)
        self.neural_k, self.neural_max_batch = neural_k, neural_max_batch
        self.target = target
        if rule not in RULES:
            raise GateError(f"SWITCHSD_RULE={rule!r}: expected one of {', '.join(RULES)}")
        self.rule = rule
        self.backoff = CopyCounts() if backoff else None      # chains where the kappa-gram never occurred before
        self.costs = PathCosts(half_life=half_life or None)     # 0: the acceptance record never forgets
        self.logits = torch.zeros(max_tokens)                  # [tokens of the last target forward]
        self.aux: int | None = None                            # EAGLE-3 feature block the probe reads (mlp site)
        self.capture_checked = False                           # `check_capture`, at the first step
        self.counts = {"steps": 0, "copy": 0, "neural": 0, "none": 0, "none_chain": 0,   # none though a chain was there
                       "copy_tokens": 0, "copy_backoff": 0,
                       "eagle_steps": 0, "eagle_skipped": 0,   # engine steps with / without EAGLE-3's forward
                       "accepted": {"copy": 0, "neural": 0}, "verified": {"copy": 0, "neural": 0},
                       "gate_s": 0.0, "period_s": 0.0}   # the probe and gate's time; engine steps' time (< 1 s apart)
        self.last_call, self.last_ids = None, []
        self.previous: dict[str, tuple[str, int]] = {}   # request id -> (its last draft's path, tokens drafted)
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
        return {**c, "mal": mean_accepted(c)}

    def _read(self, module, args, output) -> None:
        t = time.perf_counter()
        residual = output[1] if isinstance(output, tuple) else output        # [n, d] after attention
        n = residual.shape[0]
        if n > self.logits.shape[0]:
            self.logits = torch.zeros(n)
        self.logits[:n].copy_(residual.float() @ self.w.to(residual.device))
        self.counts["gate_s"] += time.perf_counter() - t

    def plan(self, scores: list[float], seqs: list[np.ndarray], req_ids: list[str], k: int,
             live: list[bool] | None = None, rows: list[int] | None = None,
             accepted: list[int] | None = None,
             prompt_lens: list[int] | None = None) -> tuple[list[list[int] | None], int | None]:
        """Each request's next draft: its copy chain (<= k tokens), None (EAGLE-3's draft) or [] (no draft), and
        how many tokens EAGLE-3 drafts this step (None: it does not run).

        scores: each request's probe probability (`scores`); seqs: its committed tokens, this step's included
        (`committed`); live: False for a request still reading its prompt in chunks (vLLM discards its draft).
        The copy chain: the kappa-gram's earlier occurrence in the request (`copy_match`), else the
        longest context that the requests' tokens continued before (`CopyCounts`). Rule "probe" (the paper's):
        a request copies when the probe fires AND its kappa-gram occurred before. Rule "cost" (the default): the
        copy chain cut to the best length, EAGLE-3's draft or no draft, whichever is expected to emit the most
        tokens per second (`PathCosts.choose`: acceptance by draft position per path, probe state and match
        length; step times by the step's rows, every request's, and by whether EAGLE-3 drafted; the other requests
        in the step bring their usual rows and tokens). With more than `neural_max_batch`
        live requests EAGLE-3 does not run: a request copies wherever it has a chain. rows / accepted: each request's rows in this step's target
        forward and how many of its drafts were accepted; they credit the request's previous draft. prompt_lens:
        each request's prompt length (the shared counts hold outputs only; without them, none)."""
        t = time.perf_counter()
        if self.last_call is not None and t - self.last_call < 1.0:
            self.counts["period_s"] += t - self.last_call
            if req_ids == self.last_ids:          # the same requests: a decoding step (no prompt read between)
                self.costs.step(t - self.last_call)
        self.last_call, self.last_ids = t, list(req_ids)
        live = live if live is not None else [True] * len(scores)
        n_live = sum(live)
        neural_on = n_live <= self.neural_max_batch
        if rows is not None and accepted is not None:       # the step just verified, for `choose`: decoding rows only
            step = [(r, a) for r, a, x in zip(rows, accepted, live) if x and r <= k + 1]
            if step:
                self.costs.observe(len(step), sum(r for r, _ in step), sum(1 + a for _, a in step))
        out: list[list[int] | None] = []
        for i, s in enumerate(scores):
            before = self.previous.pop(req_ids[i], None)
            if not live[i]:
                out.append([])
                continue
            if before is not None and rows is not None and accepted is not None and 1 <= rows[i] - 1 <= before[1]:
                tag, path = before[0], before[0].split(":")[0]      # rows[i] - 1 of its drafts were verified
                self.counts["verified"][path] += 1
                self.counts["accepted"][path] += accepted[i]
                self.costs.credit(tag, rows[i] - 1, accepted[i])
            high = s >= self.tau
            if self.backoff is not None:
                self.backoff.add(req_ids[i], seqs[i], prompt_lens[i] if prompt_lens is not None else len(seqs[i]))
            counts = self.backoff if self.rule == "cost" or not neural_on else None
            chain, key, backed_off = copy_path(seqs[i], req_ids[i], self.kappa, k, counts, self.factor)
            had_chain = bool(chain)
            tag = f"copy:{'high' if high else 'low'}:{key}"
            if self.rule == "probe":
                path = ("copy" if chain and high else "neural") if neural_on else ("copy" if chain else "none")
            else:
                n = self.costs.choose(tag, len(chain), min(self.neural_k, k) if neural_on else 0, n_live - 1)
                path, chain = ("neural", []) if n is None else ("copy" if n else "none", chain[:n])
            self.counts["steps"] += 1
            self.counts[path] += 1
            self.counts["none_chain"] += path == "none" and had_chain
            if path == "copy":
                self.counts["copy_tokens"] += len(chain)
                self.counts["copy_backoff"] += backed_off
                self.previous[req_ids[i]] = (tag, len(chain))
            elif path == "neural":
                self.previous[req_ids[i]] = ("neural", min(self.neural_k, k))
            out.append(None if path == "neural" else chain if path == "copy" else [])
        self.calls += 1
        if len(self.previous) > 4 * len(req_ids) + 64:          # finished requests: forget them
            self.previous = {r: v for r, v in self.previous.items() if r in set(req_ids)}
        if self.calls % LOG_EVERY == 0:
            log(self.counts)
        # EAGLE-3 runs only when a request takes its path. When every request copies it does not run at all (on
        # this CPU its first pass alone, vLLM's k = 0, costs a quarter of a step); the positions it skipped stay
        # out of its own KV cache, which costs its later drafts some acceptance, never correctness
        eagle_k = min(self.neural_k, k) if neural_on and None in out else None
        self.counts["eagle_skipped" if eagle_k is None else "eagle_steps"] += 1
        total = sum(1 + (eagle_k or 0 if d is None else len(d)) for d, x in zip(out, live) if x)   # the step's rows
        self.costs.planned(eagle_k is not None, total if all(live) else None)
        self.counts["gate_s"] += time.perf_counter() - t
        return out, eagle_k

    def merge(self, plan: list[list[int] | None], eagle: torch.Tensor | None) -> list[list[int]]:
        """The drafts vLLM verifies: each copy chain, EAGLE-3's row (eagle [B, k]) where the plan says None."""
        rows = eagle.tolist() if eagle is not None else None
        drafts = [p if p is not None else rows[i] for i, p in enumerate(plan)]
        write_counts(lambda: {**self.counts, "costs": self.costs.summary()})
        return drafts


def mean_accepted(c: dict) -> dict[str, float]:
    """Per path: mean tokens accepted per verified draft."""
    return {p: c["accepted"][p] / max(1, c["verified"][p]) for p in ("copy", "neural")}


def env(name: str):
    """A registered variable (switchsd/envs.py); a malformed value is a GateError naming it."""
    try:
        return envs.get(name)
    except ValueError as e:
        raise GateError(str(e)) from None


def captured(target) -> tuple[int, ...]:
    """The layer ids whose inputs vLLM's EAGLE-3 path captures (id i: the output of layer i - 1); () for none."""
    inner = getattr(target, "model", target)
    return tuple(int(x) for x in getattr(inner, "aux_hidden_state_layers", None) or ())


def aux_layers(target) -> tuple[int, ...]:
    """`captured`, which an 'mlp' probe needs."""
    layers = captured(target)
    if not layers:
        raise GateError("an 'mlp' probe reads EAGLE-3's captured layer outputs, and this target captures none")
    return layers


def check_capture(target, num_layers: int, head_ids) -> None:
    """vLLM captures each distinct layer id in 0..num_layers once and hands EAGLE-3 their concatenation: a head whose
    ids (`eagle_aux_hidden_state_layer_ids`; None: vLLM's three defaults) repeat or fall outside would get fewer
    hidden states than its fc takes, and vLLM's proposer would fail at the first neural step (which the gate may
    reach late, by measured times). Checked at the first step instead, with what to change."""
    ids = list(captured(target))
    wanted = len(head_ids) if head_ids is not None else 3
    if len(ids) != wanted or any(not 0 <= i <= num_layers for i in ids):
        named = f"its eagle_aux_hidden_state_layer_ids {list(head_ids)}" if head_ids is not None else "vLLM's default ids"
        raise GateError(f"the EAGLE-3 head takes {wanted} hidden states ({named}), and vLLM captures layers {ids} of "
                        f"this {num_layers}-layer model (each id in 0..{num_layers} once): give the head {wanted} "
                        f"distinct ids in 0..{num_layers}")


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
    s, mal = max(1, counts["steps"]), mean_accepted(counts)
    init_logger(LOGGER).info(
        "SwitchSD gate: %d request-steps; copy %.1f%% (%.2f tokens drafted, %.2f accepted per draft); "
        "neural %.1f%% (%.2f accepted per draft); none %.1f%% (%.1f%% though a chain was there); EAGLE-3 skipped "
        "on %d of %d steps; probe and gate %.1f%% of the step time", counts["steps"], 100 * counts["copy"] / s,
        counts["copy_tokens"] / max(1, counts["copy"]), mal["copy"], 100 * counts["neural"] / s, mal["neural"],
        100 * counts["none"] / s, 100 * counts["none_chain"] / s, counts["eagle_skipped"], counts["eagle_steps"] + counts["eagle_skipped"],
        100 * counts["gate_s"] / counts["period_s"] if counts["period_s"] else 0.0)     # 0: nothing timed (a replay)


def check_setup(vllm_config, probe_path: str):
    """The probe, once the server's configuration is one the gate can run in; else a GateError saying what to
    change (each refusal tested with a stand-in configuration: tests/test_vllm_plugin.py)."""
    spec = vllm_config.speculative_config
    if spec.method != "eagle3":
        raise GateError(f"the SwitchSD gate wraps EAGLE-3; this server drafts with {spec.method!r}")
    if getattr(spec, "draft_sample_method", "greedy") != "greedy":
        raise GateError("the SwitchSD gate writes point-mass copy drafts: it needs EAGLE-3's greedy drafting")
    if getattr(spec, "disable_padded_drafter_batch", False):
        raise GateError("the SwitchSD gate reads the probe at the target forward's own rows: it needs vLLM's "
                        "padded drafter batch (drop disable_padded_drafter_batch)")
    hf = vllm_config.model_config.hf_config
    probe = load_gate_probe(probe_path, int(hf.hidden_size), int(hf.num_hidden_layers), hf)
    if probe.sublayer == "attn" and not getattr(vllm_config.model_config, "enforce_eager", True):
        raise GateError(f"{probe_path}: an 'attn' probe reads layer {probe.layer} through a forward hook, which "
                        f"vLLM's compiled graphs do not run: serve with --enforce-eager, or use a probe on a "
                        f"layer EAGLE-3 captures ('mlp')")
    return probe


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
        probe = check_setup(self.vllm_config, probe_path)
        self._switchsd_gate = Gate(probe, target_model, self.vllm_config.scheduler_config.max_num_batched_tokens,
                                   env("SWITCHSD_KAPPA") or KAPPA, env("SWITCHSD_NEURAL_K"),
                                   env("SWITCHSD_NEURAL_MAX_BATCH"), env("SWITCHSD_RULE"), env("SWITCHSD_BACKOFF"),
                                   env("SWITCHSD_HALF_LIFE"), env("SWITCHSD_SPEC_FACTOR"))

    def gated_propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                      next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                      *args, **kwargs):
        gate = getattr(self, "_switchsd_gate", None)
        if gate is not None and not gate.capture_checked:       # vLLM sets the captured layers after load_model
            draft = self.vllm_config.speculative_config.draft_model_config.hf_config
            check_capture(gate.target, int(self.vllm_config.model_config.hf_config.num_hidden_layers),
                          getattr(draft, "eagle_aux_hidden_state_layer_ids", None))
            gate.capture_checked = True
        if gate is None or num_speculative_tokens == 0:
            return propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                           next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                           *args, **kwargs)
        t = time.perf_counter()
        start = common_attn_metadata.query_start_loc.cpu()
        first = start[:-1]
        last = token_indices_to_sample
        if last is None:                  # vLLM's own rule: the last scheduled token, less the rejected drafts
            last = start[1:] - 1
            rejected = kwargs.get("num_rejected_tokens_gpu", args[1] if len(args) > 1 else None)
            if rejected is not None:
                last = last - rejected.cpu()
        last = last.cpu()
        batch = self._switchsd_runner.input_batch
        positions = target_positions[0] if target_positions.dim() == 2 else target_positions    # M-RoPE: [3, T]
        seqs = committed(batch.token_ids_cpu, first.numpy(), last.numpy(), target_token_ids.cpu().numpy(),
                         positions.cpu().numpy(), next_token_ids.cpu().numpy())
        # a request whose forward ended before its prompt's end is reading its prompt in chunks
        live = [len(q) - 1 >= int(p) for q, p in zip(seqs, batch.num_prompt_tokens[:len(seqs)])]
        rows, accepted = (start[1:] - first).tolist(), (last - first).tolist()
        gate.counts["gate_s"] += time.perf_counter() - t
        plan, eagle_k = gate.plan(gate.scores(last, target_hidden_states), seqs, batch.req_ids,
                                  num_speculative_tokens, live, rows, accepted,
                                  [int(p) for p in batch.num_prompt_tokens[:len(seqs)]])
        drafts = None
        if eagle_k is not None:
            drafts = propose(self, eagle_k, target_token_ids, target_positions, target_hidden_states, next_token_ids,
                             token_indices_to_sample, common_attn_metadata, sampling_metadata, *args, **kwargs)
        else:
            self._last_draft_probs = None         # nothing drafted: no stale probabilities for the runner
        return gate.merge(plan, drafts)

    for wrapper, original in ((gated_init, init), (gated_load_model, load_model), (gated_propose, propose)):
        functools.update_wrapper(wrapper, original)            # signatures read through (`check_internals`)
    EagleProposer.__init__, EagleProposer.load_model, EagleProposer.propose = gated_init, gated_load_model, gated_propose
    EagleProposer._switchsd = True
