"""SMC-SD (arXiv 2604.15672; notes: ../shared/research/seed_extras.md section 2): sequential Monte Carlo in place of
token-level rejection. APPROXIMATE: the output is a sample of the target only as the particle count grows.

N particles each draft gamma tokens from the draft distribution q (at T_draft); one batched target forward
scores every particle's gamma+1 positions; every drafted token is KEPT (no rollback) and the mismatch goes into
an importance weight, log w += sum_j [log p_T(x_j) - log q(x_j)]; the bonus token is drawn from p_T. When the
effective sample size ESS = 1 / sum(w_bar^2) drops below `ess_threshold` * N the particles are resampled
(systematic resampling: one uniform per step) and their weights reset. At the end one particle is returned,
drawn with probability proportional to its weight. Positions after a particle's EOS add nothing to its weight.

`smc_decode` is the whole algorithm over three batched callables, so the model engine (`SMCEngine`: a draft
model or the target's first layers as the drafter) and the toy Markov-chain tests run the same code.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .config import SMCConfig
from .events import StepEvent, summarize


def systematic_resample(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """weights [N] (normalised) -> ancestor indices [N]: one uniform u, points (u + i) / N on the CDF."""
    n = weights.shape[0]
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    points = (u + torch.arange(n, dtype=torch.float64)) / n
    cdf = weights.double().cumsum(0)
    cdf[-1] = 1.0
    return torch.searchsorted(cdf, points).clamp(max=n - 1)


def ess(logw: torch.Tensor) -> float:
    w = torch.softmax(logw.double(), 0)
    return float(1.0 / (w * w).sum())


@dataclass
class SMCResult:
    tokens: list[int]                   # the chosen particle's generated tokens
    cycles: int                         # target forwards
    resamples: int
    mean_ess: float                     # before each resampling check
    particles: list[list[int]] = field(default_factory=list)
    log_weights: list[float] = field(default_factory=list)


def smc_decode(draft_step: Callable[[torch.Tensor], torch.Tensor],
               verify: Callable[[torch.Tensor], torch.Tensor],
               reorder: Callable[[torch.Tensor], None],
               first: torch.Tensor, cfg: SMCConfig, max_new_tokens: int, eos: Sequence[int],
               generator: torch.Generator, observe: Callable[[torch.Tensor], None] | None = None) -> SMCResult:
    """first [N]: each particle's pending token (sampled from the target after the prompt).
    draft_step(last [N]) -> q [N, V] for the next position (the drafter's state advances by `last`).
    verify(block [N, gamma+1]) -> p [N, gamma+1, V]: the target after each block position (its state advances).
    reorder(ancestors [N]): copy both states from the chosen ancestors.
    observe(block [N, gamma+1]) after each verify (default: the drafter's state advances by x_gamma)."""
    N, g = cfg.n_particles, cfg.gamma
    eos = set(int(e) for e in eos)
    seqs = [[int(t)] for t in first.tolist()]
    done = [seqs[i][0] in eos for i in range(N)]
    logw = torch.zeros(N, dtype=torch.float64)
    last = first.clone()
    cycles = resamples = 0
    ess_sum = 0.0
    while not all(done) and min(len(s) for s in seqs) < max_new_tokens:
        xs, lq = [], torch.zeros(N, g, dtype=torch.float64)
        cur = last
        for j in range(g):                                                   # 1. draft gamma tokens per particle
            q = draft_step(cur).double()                                     # [N, V]
            x = torch.multinomial(q, 1, generator=generator)[:, 0]
            lq[:, j] = q.gather(1, x[:, None])[:, 0].clamp_min(1e-300).log()
            xs.append(x)
            cur = x
        block = torch.stack([last] + xs, 1)                                  # [N, gamma+1]
        p = verify(block).double()                                           # 2. one target forward [N, g+1, V]
        lp = p[:, :g].gather(2, block[:, 1:, None])[:, :, 0].clamp_min(1e-300).log()
        bonus = torch.multinomial(p[:, g], 1, generator=generator)[:, 0]     # 4. bonus from p_T
        for i in range(N):                                                   # 3. weights; EOS stops a particle
            if done[i]:
                continue
            new = block[i, 1:].tolist() + [int(bonus[i])]
            cut = next((k for k, t in enumerate(new) if t in eos), None)
            upto = g if cut is None else min(cut + 1, g)
            logw[i] += float((lp[i, :upto] - lq[i, :upto]).sum())
            seqs[i] += new if cut is None else new[:cut + 1]
            done[i] = cut is not None or len(seqs[i]) >= max_new_tokens
        if observe is not None:
            observe(block)
        else:
            draft_step(block[:, -1])          # the drafter sees x_gamma (its own last draft) before the bonus
        last = bonus
        cycles += 1
        e = ess(logw)
        ess_sum += e
        if cfg.ess_threshold > 0 and e < cfg.ess_threshold * N:              # 5. systematic resampling
            anc = systematic_resample(torch.softmax(logw, 0), generator)
            reorder(anc)
            seqs = [list(seqs[a]) for a in anc.tolist()]
            done = [done[a] for a in anc.tolist()]
            last = last[anc]
            logw.zero_()
            resamples += 1
    pick = int(torch.multinomial(torch.softmax(logw, 0), 1, generator=generator))
    out = seqs[pick][:max_new_tokens]
    return SMCResult(out, cycles, resamples, ess_sum / max(1, cycles), [s[:max_new_tokens] for s in seqs],
                     logw.tolist())


def self_draft(model, layers: int):
    """The target's first `layers` decoder layers + its final norm and LM head, sharing the target's weights:
    a draft model with the target's tokenizer and a full q (what SMC needs), for targets without a small sibling."""
    import copy

    from transformers import AutoModelForCausalLM
    n = model.config.num_hidden_layers
    if not 1 <= layers < n:
        raise ValueError(f"self-draft layers must be in [1, {n - 1}], got {layers}")
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = layers
    with torch.device("meta"):
        draft = AutoModelForCausalLM.from_config(cfg)
    inner, src = draft.model, model.model
    inner.embed_tokens, inner.norm, inner.rotary_emb = src.embed_tokens, src.norm, src.rotary_emb
    inner.layers = torch.nn.ModuleList(src.layers[:layers])
    draft.lm_head = model.lm_head
    return draft.eval().requires_grad_(False)


class SMCEngine:
    """SMC-SD on a Hugging Face target and a particle drafter (switchsd/drafters/particles.py: the EAGLE-3 head,
    a draft model or a self-draft), batched over particles with one KV cache per particle. Same interface as
    Engine (generate / run / close); the events follow the particle drawn at the end, so they come after the
    whole run (the output is only known then)."""
    approximate = True

    def __init__(self, model, drafter, cfg: SMCConfig, max_new_tokens: int = 128, eos_ids: Sequence[int] = (),
                 max_length: int | None = None):
        """`drafter`: a particle drafter (the protocol of switchsd/drafters/particles.py), injected by the
        factory; a bare model is not one (wrap it: drafters.particles.ModelParticles)."""
        if isinstance(drafter, torch.nn.Module):
            raise TypeError("SMCEngine needs a particle drafter (e.g. drafters.particles.ModelParticles(model, T)), "
                            "not a bare model")
        self.model, self.drafter, self.cfg = model, drafter, cfg
        self.max_new_tokens, self.eos = max_new_tokens, list(eos_ids)
        self.max_length = max_length or int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.policy = self.probe = None
        self.last_result: SMCResult | None = None

    def close(self) -> None:
        pass

    def run(self, prompt_ids: Sequence[int], generator: torch.Generator | None = None):
        from .engine import Generation
        t0 = time.perf_counter()
        events = list(self.generate(prompt_ids, generator))
        res = self.last_result
        stats = summarize(events, time.perf_counter() - t0)
        stats.update(steps=res.cycles, tok_per_fwd=len(res.tokens) / max(1, res.cycles), mean_ess=res.mean_ess,
                     resamples=res.resamples, resample_rate=res.resamples / max(1, res.cycles))
        return Generation(list(prompt_ids), res.tokens, events, stats)

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], generator: torch.Generator | None = None):
        from transformers import DynamicCache
        cfg, N, drafter = self.cfg, self.cfg.n_particles, self.drafter
        generator = generator or torch.Generator().manual_seed(0)
        ids = [int(t) for t in prompt_ids]
        if len(ids) + self.max_new_tokens + cfg.gamma + 2 >= self.max_length:
            raise ValueError(f"the prompt has {len(ids)} tokens; the model's context is {self.max_length}")
        dev = next(self.model.parameters()).device
        hid = drafter.needs_hidden
        t0 = time.perf_counter()
        tcache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=torch.tensor([ids], device=dev), cache=tcache, use_cache=True,
                         output_hidden_states=hid, logits_to_keep=0 if hid else 1)
        tcache.batch_repeat_interleave(N)                         # each particle holds the prompt
        p0 = torch.softmax(out.logits[0, -1].float().cpu() / cfg.target_temperature, -1)
        first = torch.multinomial(p0.expand(N, -1), 1, generator=generator)[:, 0]
        drafter.start(ids, first, out.hidden_states)
        state = {"t": len(ids), "hidden": None}
        prefill_s = time.perf_counter() - t0

        def verify(block: torch.Tensor) -> torch.Tensor:
            k = block.shape[1]
            pos = torch.arange(state["t"], state["t"] + k, device=dev)[None].expand(N, -1)
            o = self.model(input_ids=block.to(dev), position_ids=pos, cache=tcache, use_cache=True,
                           output_hidden_states=hid)
            state["t"] += k
            state["hidden"] = o.hidden_states
            return torch.softmax(o.logits.float().cpu() / cfg.target_temperature, -1)

        def reorder(anc: torch.Tensor) -> None:
            tcache.reorder_cache(anc.to(dev))
            drafter.reorder(anc)

        t1 = time.perf_counter()
        res = smc_decode(drafter.draft, verify, reorder, first, cfg, self.max_new_tokens, self.eos, generator,
                         observe=lambda block: drafter.observe(block, state["hidden"]))
        self.last_result = res
        per = (time.perf_counter() - t1) / max(1, res.cycles)
        k = 0
        # one event per target forward along the chosen particle (the first also carries the prefill's token)
        sizes = [cfg.gamma + 2] + [cfg.gamma + 1] * max(0, res.cycles - 1)
        for c, n in enumerate(sizes):
            new = res.tokens[k:k + n]
            if not new:
                break
            last = k + n >= len(res.tokens)
            pending = ids[-1] if c == 0 else res.tokens[k - 1]   # every drafted token is kept (no rollback)
            yield StepEvent(step=c, path="smc", drafter="smc", candidates=[new[:-1]], tree_tokens=[pending] + new[:-1],
                            tree_parents=list(range(-1, len(new) - 1)), accepted_rows=list(range(1, len(new))),
                            accepted=new[:-1], accepted_candidate=0,
                            bonus=new[-1], new_tokens=new, position=len(ids) + k,
                            timings={"total": per, **({"prefill": prefill_s} if c == 0 else {})},
                            gate={"mean_ess": res.mean_ess, "resamples": res.resamples, "particles": N} if c == 0 else None,
                            finished=("eos" if new[-1] in self.eos else "max_new_tokens") if last else None,
                            rule="SMC-SD (approximate)")
            k += n
