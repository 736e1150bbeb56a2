"""The vLLM plugin (switchsd/vllm): the copy proposer drafts what the engine's copy drafter drafts first; the plugin
refuses a vLLM it was not written against, naming what moved; and, in vLLM's own environment (.venv-vllm, `make
vllm`), vLLM loads the plugin and its greedy outputs with the copy proposer equal its outputs without
speculation."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from switchsd.core.acceptance import HALF_LIFE
from switchsd.core.config import CopyConfig
from switchsd.core.drafting import DraftRequest
from switchsd.drafters.copy import CopyDrafter
from switchsd.vllm import VllmVersionError, check_internals, register
from switchsd.vllm.copy import CopyCounts, CopyProposer, copy_chain, copy_match
from switchsd.vllm.costs import PathCosts
from switchsd.vllm.gate import Gate, GateError, committed, load_gate_probe

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-vllm" / "bin" / "python"


def _longest_context_occurrence(toks: list[int], kappa: int) -> int | None:
    """Reference: the start of the kappa-gram's earlier occurrence whose preceding tokens match the present's
    longest (<= 24 in all), the most recent among equals."""
    n, best, best_m = len(toks), None, -1
    for s in range(n - kappa):                              # ascending: ties go to the later
        if toks[s:s + kappa] != toks[n - kappa:]:
            continue
        m = kappa
        while m < 24 and s - (m - kappa) - 1 >= 0 and n - m - 1 >= 0 and toks[s - (m - kappa) - 1] == toks[n - m - 1]:
            m += 1
        if m >= best_m:
            best, best_m = s, m
    return best


def test_copy_chain_is_one_of_the_copy_drafter_s_candidates_the_longest_match_s():
    r = random.Random(0)
    drafted = repeated = older = 0
    for _ in range(1500):
        toks = [r.randrange(4) for _ in range(r.randrange(1, 60))]
        d = CopyDrafter(CopyConfig(kappa=3, max_draft_len=6, max_candidates=100))
        d.reset(toks)
        draft = d.propose(DraftRequest(tokens=toks, max_len=6, budget=1000))
        chain, gap, match = copy_match(np.array(toks), 3, 6)
        assert chain == copy_chain(np.array(toks), 3, 6)
        s = _longest_context_occurrence(toks, 3)
        if s is None:
            assert chain == [] and not draft
            continue
        want = toks[s + 3:s + 9]
        assert want in draft.candidates                     # one of the engine's candidates ...
        assert chain[:len(want)] == want and len(chain) == 6, toks
        ext = toks + chain                                  # ... and where it ran into the present, the chain itself
        assert all(ext[len(toks) - gap + j] == chain[j] for j in range(6)), toks
        assert match >= 3
        drafted += 1
        repeated += len(want) < 6
        older += s != max(i for i in range(len(toks) - 3) if toks[i:i + 3] == toks[-3:])
    assert drafted > 400 and repeated > 50 and older > 20    # none vacuous (446, 80 and 34 of 1,500)


def test_copy_chain_drafts_a_loop_to_full_depth_and_prefers_the_longer_context():
    loop = np.array([7, 1, 2, 3, 9, 9, 9, 9])                  # "9 9 9" last occurred one token back
    assert copy_chain(loop, 3, 5) == [9, 9, 9, 9, 9]
    assert copy_match(np.array([4, 5, 6, 4, 5, 6, 4, 5]), 2, 7)[:2] == ([6, 4, 5, 6, 4, 5, 6], 3)
    assert copy_chain(np.array([1, 2, 3, 8, 8, 1, 2, 3]), 3, 2) == [8, 8]      # not reaching the present: as is
    ctx = np.array([5, 1, 2, 3, 4, 0, 1, 2, 3, 6, 9, 5, 1, 2, 3])             # "1 2 3" after "5" and after "0"
    assert copy_match(ctx, 3, 1) == ([4], 11, 4)           # the earlier one, whose "5" matches too: 4 tokens


def test_the_gate_s_copy_chain_is_capped_by_the_context_it_matched():
    from switchsd.vllm.copy import copy_path
    short = np.array([5, 1, 2, 7, 8, 9, 10, 11, 12, 6, 1, 2])          # "1 2" matched, the token before differs
    assert copy_path(short, "a", 2, 8, None) == ([7, 8, 9, 10], "2", False)         # 2 tokens matched: <= 4
    assert copy_path(short, "a", 2, 8, None, factor=100)[0] == [7, 8, 9, 10, 11, 12, 6, 1]
    longer = np.array([4, 5, 1, 2, 7, 8, 9, 10, 11, 12, 13, 14, 4, 5, 1, 2])      # 4 tokens matched: <= 8
    assert copy_path(longer, "a", 2, 16, None) == ([7, 8, 9, 10, 11, 12, 13, 14], "3", False)
    assert copy_path(longer, "a", 2, 3, None)[0] == [7, 8, 9]                         # and <= k


def test_each_method_is_served_at_its_default_draft_length_unless_one_is_given(capsys):
    from switchsd.vllm.methods import METHODS, main, speculative_config
    assert speculative_config("none") is None
    assert speculative_config("suffix") == {"method": "suffix"}                 # vLLM's own default (24)
    assert speculative_config("switchsd")["num_speculative_tokens"] == 24
    assert speculative_config("copy")["num_speculative_tokens"] == 5
    assert speculative_config("eagle3", 9)["num_speculative_tokens"] == 3      # fixed: k 3, the head's
    assert speculative_config("suffix", 5) == {"method": "suffix", "num_speculative_tokens": 5}
    assert {speculative_config(m, 6)["method"] for m in METHODS[1:]} == {"ngram", "suffix", "eagle3", "custom_class"}
    with pytest.raises(ValueError, match="unknown method 'medusa'"):
        speculative_config("medusa")
    with pytest.raises(SystemExit, match="draft length 0"):
        main(["copy", "0"])
    main(["--serve-flags"])                        # one set of server flags for the bench, the pairs and make
    assert capsys.readouterr().out.split() == ["--dtype", "float32", "--max-model-len", "4096", "--seed", "0",
                                               "--enforce-eager"]


def test_counts_file_holds_the_newest_counts_soon_after_the_last_step(tmp_path, monkeypatch):
    import time

    from switchsd.vllm import copy as vcopy
    path = tmp_path / "counts.json"
    monkeypatch.setenv(vcopy.COUNTS_ENV, str(path))
    taken = []
    for i in range(200):                          # 200 steps in well under FLUSH_S
        vcopy.write_counts(lambda i=i: taken.append(i) or {"steps": i})
    time.sleep(3 * vcopy.FLUSH_S)
    assert json.loads(path.read_text()) == {"steps": 199}
    assert len(taken) <= 2, "a snapshot per step, not per flush"


def test_copy_proposer_drafts_per_request_and_counts_its_paths():
    cfg = types.SimpleNamespace(speculative_config=types.SimpleNamespace(num_speculative_tokens=4),
                                model_config=types.SimpleNamespace(max_model_len=64))
    p = CopyProposer(cfg)
    toks = np.zeros((3, 64), dtype=np.int64)
    toks[0, :10] = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]       # "1 2 3" occurred before: copy 4 5 6 7
    toks[1, :6] = [9, 8, 7, 6, 5, 4]                     # no repeat: no draft
    toks[2, :10] = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]        # no token sampled this step: skipped
    out = p.propose([[3], [4], []], np.array([10, 6, 10]), toks)
    assert out == [[4, 5, 6, 7], [], []]
    assert p.counts == {"steps": 2, "copy": 1, "none": 1, "drafted_tokens": 4}


def test_plugin_refuses_another_vllm_and_names_a_moved_symbol(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.31.2"))
    with pytest.raises(VllmVersionError, match="pinned to vllm 0.32.0; this is 0.31.2"):
        register()
    fake = types.ModuleType("vllm.v1.spec_decode.custom_class_proposer")      # the module is there, the symbol not
    for name in ("vllm.v1", "vllm.v1.spec_decode"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.spec_decode.custom_class_proposer", fake)
    assert "vllm.v1.spec_decode.custom_class_proposer.create_custom_proposer" in check_internals()


class _Norm(torch.nn.Module):          # vLLM's fused add-and-norm: returns (normed, residual)
    def forward(self, x, residual):
        r = x + residual
        return r * 2, r


def _target(n_layers: int = 3):
    layer = lambda: types.SimpleNamespace(post_attention_layernorm=_Norm())           # noqa: E731
    return types.SimpleNamespace(model=types.SimpleNamespace(layers=[layer() for _ in range(n_layers)]))


def test_gate_copies_where_the_probe_fires_and_a_match_exists_else_keeps_eagle3(tmp_path):
    """The hook reads layer l's residual after attention for every token of the target forward; a request takes
    the copy chain iff its last verified token scores >= tau AND its last kappa tokens occurred before."""
    from switchsd.core.probe import Probe
    probe = Probe(torch.tensor([1.0, 0.0, 0.0, 0.0]), layer=1, sublayer="attn", tau=0.5)
    target = _target()
    gate = Gate(probe, target, max_tokens=8, kappa=2, neural_max_batch=8, rule="probe", backoff=False)
    x = torch.zeros(5, 4)
    x[1, 0], x[4, 0] = 3.0, -3.0                     # token 1 scores ~0.95, token 4 ~0.05
    target.model.layers[1].post_attention_layernorm(x, torch.zeros(5, 4))        # the target forward
    seqs = [np.array([5, 6, 7, 8, 9, 5, 6]),         # "5 6" occurred: copy 7 8 9
            np.array([5, 6, 7, 8, 9, 5, 6]),         # same context, probe low: EAGLE-3's draft stays
            np.array([1, 2, 3, 4])]                  # probe high, no match: EAGLE-3
    scores = gate.scores(torch.tensor([1, 4, 1]), torch.zeros(5, 12))
    assert [round(x, 2) for x in scores] == [0.95, 0.05, 0.95]
    plan, eagle_k = gate.plan(scores, seqs, ["a", "b", "c"], k=3)
    assert plan == [[7, 8, 9], None, None] and eagle_k == 3           # EAGLE-3 drafts 3 for b and c
    eagle = torch.full((3, 3), 42)
    assert gate.merge(plan, eagle) == [[7, 8, 9], [42, 42, 42], [42, 42, 42]]
    assert (gate.counts["copy"], gate.counts["neural"]) == (1, 2)
    # next step: a's 3-token copy was verified (4 rows), 2 accepted; b's 3 EAGLE-3 tokens, 1 accepted
    seqs[0] = np.array([5, 6, 7, 8, 9, 5, 6, 7, 8, 0])
    plan, eagle_k = gate.plan(scores, seqs, ["a", "b", "c"], k=5, rows=[4, 4, 1], accepted=[2, 1, 0])
    assert gate.counts["accepted"] == {"copy": 2, "neural": 1}
    assert gate.counts["verified"] == {"copy": 1, "neural": 1}        # c's draft was not scheduled (1 row)
    assert plan[0] is None                                             # "8 0" never occurred before
    # every request copies: EAGLE-3 does not run
    plan, eagle_k = gate.plan([0.95, 0.95], [np.array([5, 6, 7, 8, 9, 5, 6])] * 2, ["a", "b"], k=2)
    assert plan == [[7, 8], [7, 8]] and eagle_k is None
    # a request reading its prompt in chunks (live False) is neither drafted for nor credited: its chunk's
    # tokens are not accepted drafts
    steps = gate.counts["steps"]
    plan, _ = gate.plan(scores, [np.arange(40), seqs[1], seqs[2]], ["d", "b", "c"], k=3,
                        live=[False, True, True], rows=[40, 4, 4], accepted=[39, 3, 3])
    assert gate.counts["steps"] == steps + 2 and "d" not in gate.previous and plan[0] == []


def test_above_neural_max_batch_eagle3_does_not_run_and_requests_copy_where_a_match_exists():
    """More running requests than neural_max_batch: the copy drafter's rule alone (a match, whatever the probe),
    no draft otherwise, and EAGLE-3's forward skipped."""
    from switchsd.core.probe import Probe
    gate = Gate(Probe(torch.tensor([1.0, 0.0]), layer=1, sublayer="attn", tau=0.5), _target(), max_tokens=8,
                kappa=2, neural_max_batch=1, rule="probe", backoff=False)
    seqs = [np.array([5, 6, 7, 8, 9, 5, 6]), np.array([1, 2, 3, 4])]
    plan, eagle_k = gate.plan([0.05, 0.95], seqs, ["a", "b"], k=4)
    assert plan == [[7, 8, 9, 5], []] and eagle_k is None
    assert (gate.counts["copy"], gate.counts["none"], gate.counts["neural"], gate.counts["eagle_skipped"]) == (1, 1, 0, 1)
    assert gate.merge(plan, None) == [[7, 8, 9, 5], []]
    plan, eagle_k = gate.plan([0.05], seqs[:1], ["a"], k=4)          # one request: the probe decides again
    assert plan == [None] and eagle_k == 3


def test_copy_counts_draft_from_the_longest_context_seen_before_own_or_shared():
    c = CopyCounts(max_n=4, min_prob=0.4, max_requests=2)
    c.add("a", np.array([1, 2, 3, 7, 8, 9, 4]), prompt_len=3)          # a's output: 7 8 9 4
    assert c.chain("b", np.array([5, 2, 3, 7, 8]), 5) == ([9, 4], 4)   # "2 3 7 8" in the shared outputs
    assert c.chain("b", np.array([5, 8]), 5) == ([9], 1)               # a 1-token match drafts 1 token
    assert c.chain("b", np.array([5, 1, 2]), 5) == ([], 0)             # "1 2" is a's prompt: not shared
    assert c.chain("a", np.array([5, 1, 2]), 5) == ([3, 7], 2)         # ... but a's own
    c.add("b", np.array([0, 8, 5, 8, 6]), prompt_len=1)                # shared "8" -> 9, 5, 6 (1/3 each)
    assert c.chain("c", np.array([3, 8]), 3) == ([], 0)                # 1/3 < min_prob: no draft
    assert c.chain("b", np.array([0, 8]), 3) == ([5, 8], 2)            # b's own "0 8" -> 5 -> "8 5" -> 8
    assert c.chain("c", np.array([7, 8]), 3) == ([9, 4], 2)            # the longer context decides
    c.add("b", np.array([0, 8, 5, 8, 6, 8, 6]), prompt_len=1)          # b grew: its "8 6" -> 8 counted once
    assert c.own["b"][np.array([8, 6], dtype=np.int64).tobytes()] == {8: 1}
    c.add("c", np.array([1]), prompt_len=1)                            # a third request: a's own table goes
    assert "a" not in c.own and c.chain("c", np.array([7, 8]), 2) == ([9, 4], 2)    # the shared counts stay


def _set_times(costs, table: dict) -> None:
    """Measured step times, (EAGLE-3 drafted, rows) -> [seconds, steps], through `PathCosts.set_time`."""
    for (eagle, rows), (seconds, steps) in table.items():
        costs.set_time(eagle, rows, seconds, steps)


def test_the_cost_rule_drafts_what_is_expected_to_emit_the_most_tokens_per_second():
    from switchsd.core.probe import Probe
    probe = Probe(torch.tensor([1.0, 0.0]), layer=1, sublayer="attn", tau=0.5)
    gate = Gate(probe, _target(), max_tokens=8, kappa=2, neural_max_batch=8, rule="cost")
    gate.plan([0.05], [np.array([1, 2, 3, 7, 8, 9, 4])], ["a"], k=3, prompt_lens=[3])     # counts a's output
    b = np.array([5, 6, 8])                        # "6 8" never seen; the shared counts continue "8" with 9 4
    costs = gate.costs
    _set_times(costs, {(False, 1): [0.076, 1], (False, 2): [0.080, 1], (True, 4): [0.070, 1]})   # step seconds by rows

    def plan(name):            # a new request id each time: no step time is measured between the calls
        return gate.plan([0.05], [b], [name], k=3, prompt_lens=[2])
    assert plan("b1") == ([None], 3)               # priors: (1 + 0.4 + 0.16 + 0.064) / 70 ms over (1 + 0.7) / 80 ms
    for _ in range(10):
        costs.credit("copy:low:1", 1, 1)           # 1-token chains after a 1-token match: always accepted
    assert plan("b2") == ([[9]], None)             # (1 + 0.95) / 80 ms > (1 + 0.62) / 70 ms
    assert gate.counts["copy_backoff"] == 1        # a backed-off chain, drafted
    for _ in range(10):
        costs.credit("neural", 3, 3)
    assert plan("b3") == ([None], 3)               # EAGLE-3 accepts 0.9 a position: (1 + 2.44) / 70 ms
    costs.set_time(True, 4, 0.3)               # ... but its steps cost 300 ms
    assert plan("b4") == ([[9]], None)
    for _ in range(200):
        costs.credit("copy:low:1", 1, 0)
    costs.set_time(False, 2, 0.090)
    assert plan("b5") == ([[]], None) and gate.counts["none"] == 1      # nothing pays: no draft
    assert costs.summary()["step_ms"] == {"copy:1": 76.0, "copy:2": 90.0, "eagle:4": 300.0}
    probe_rule = Gate(probe, _target(), max_tokens=8, kappa=2, neural_max_batch=8, rule="probe")
    probe_rule.plan([0.95], [np.array([1, 2, 3, 7, 8, 9, 4])], ["a"], k=3, prompt_lens=[3])
    assert probe_rule.plan([0.95], [b], ["b"], k=3)[0] == [None]       # the paper's rule: no kappa match, EAGLE-3
    with pytest.raises(GateError, match="SWITCHSD_RULE='fast'"):
        Gate(probe, _target(), max_tokens=8, rule="fast")
    assert Gate(probe, _target(), max_tokens=8, half_life=0).costs.decay == 1.0        # SWITCHSD_HALF_LIFE=0
    assert gate.costs.decay == 0.5 ** (1 / HALF_LIFE)


def test_path_costs_measure_step_times_by_kind_and_rows_and_acceptance_by_position():
    c = PathCosts(max_len=4, half_life=None)
    c.credit("copy:high:3", 4, 2)                  # 4 drafted, the first 2 accepted: positions 1-3 reached
    c.credit("copy:high:3", 2, 2)
    rec = c.record["copy:high:3"]
    assert rec.trials == [2, 2, 1, 0] and rec.hits == [2, 2, 0, 0]
    p = [(2 + 1.4) / 4, (2 + 1.4) / 4, 1.4 / 3, 0.7]      # (hits + 2 x the prior 0.7) / (reached + 2)
    assert np.allclose(c.rates("copy:high:3", 4), np.cumprod(p))      # P(at least j accepted)
    c.planned(False, 3)
    c.step(0.08)
    c.step(5.0)                                    # nothing planned since: not counted
    assert c.step_time(False, 3) == 0.08 and c.step_time(False, 6) == 0.08 and c.step_time(True, 4) == 0.08
    c.planned(False, 3)
    c.step(0.12)                                   # the price follows every timed step (the fit is not stale)
    assert abs(c.step_time(False, 3) - 0.10) < 1e-12
    c.planned(False, 5)
    c.step(0.14)
    assert abs(c.step_time(False, 7) - 0.18) < 1e-9      # now a line: 20 ms a row
    c.set_time(True, 4, 0.5)
    assert c.step_time(True, 4) == 0.5


def test_a_path_that_missed_on_the_first_requests_is_tried_again_once_its_record_has_aged():
    """Greedy choice alone never revisits a path that looked poor early (a warm-up request's 8 EAGLE-3 drafts
    decided a whole run); the record forgets, by half-lives of drafts verified, so it drifts back to its prior."""
    for half_life, tried_again in ((None, False), (50, True)):
        c = PathCosts(half_life=half_life)
        _set_times(c, {(False, 1): [0.055, 1], (False, 2): [0.058, 1], (True, 4): [0.0767, 1]})
        for _ in range(8):
            c.credit("neural", 3, 0)                 # EAGLE-3 missed every token of its first 8 drafts
        assert c.choose("copy:low:3", 0, 3) == 0      # no chain: no draft rather than EAGLE-3
        for _ in range(500):
            c.credit("copy:low:3", 1, 1)              # the server goes on copying
        assert (c.choose("copy:low:3", 0, 3) is None) == tried_again, half_life
        assert c.rates("copy:low:3", 1)[0] > 0.98     # the path in use keeps its record


def test_where_many_requests_share_a_step_only_drafts_likely_to_be_accepted_pay():
    """Step time is a line over the rows of every request in the step (50 ms + 3 ms a row). Alone, a chain whose
    tokens are accepted 30% of the time pays; beside 15 other requests it does not (each drafted row delays 16
    requests' tokens for 0.3 of one), and one accepted 90% of the time still does."""
    c = PathCosts(half_life=None)
    _set_times(c, {(False, r): [0.050 + 0.003 * r, 1] for r in (1, 2, 16, 32)})
    for _ in range(100):
        c.credit("copy:low:2", 3, 0)
        c.credit("copy:high:2", 3, 3)
    for _ in range(30):
        c.credit("copy:low:2", 3, 3)               # low: 30% reach every position
    for _ in range(12):
        c.credit("copy:high:2", 3, 0)              # high: ~90%
    assert c.choose("copy:low:2", 3, 0) == 3 and c.choose("copy:low:2", 3, 0, others=15) == 0
    assert c.choose("copy:high:2", 3, 0, others=15) == 3
    from switchsd.core.probe import Probe
    probe = Probe(torch.tensor([1.0, 0.0]), layer=1, sublayer="attn", tau=0.5)
    gate = Gate(probe, _target(), max_tokens=64, kappa=2, neural_max_batch=0, rule="cost")     # copy or none
    gate.costs = c
    seqs = [np.array([4, 5, 6, 7, 4, 5])] * 16     # "4 5" occurred before: a chain 6 7 4 ... for each
    ids = [f"r{i}" for i in range(16)]
    plan, _ = gate.plan([0.05] * 16, seqs, ids, k=3, rows=[1] * 16, accepted=[0] * 16, prompt_lens=[2] * 16)
    assert plan == [[]] * 16 and c.pending == (False, 16)            # low probe, 16 requests: no drafts
    plan, _ = gate.plan([0.05], seqs[:1], ids[:1], k=3, rows=[1], accepted=[0], prompt_lens=[2])
    assert plan == [[6, 7, 4]] and c.pending == (False, 4)           # alone: the chain pays


def test_one_noisy_row_count_does_not_price_itself_out_of_being_drafted():
    c = PathCosts()
    _set_times(c, {(False, 1): [5.0, 100], (False, 2): [0.2, 1], (False, 3): [5.6, 100]})   # 50 ms, one 200 ms, 56 ms
    for _ in range(50):
        c.credit("copy:low:1", 1, 0)
    for _ in range(50):
        c.credit("copy:low:1", 1, 1)                # a 1-token chain accepted half the time
    assert abs(c.step_time(False, 2) - 0.053) < 0.002     # the line through the row counts, not the one outlier
    assert c.choose("copy:low:1", 1, 0) == 1        # 1.5 tokens / 53 ms over 1 / 50 ms
    c.set_time(True, 4, 0.09)
    assert abs(c.step_time(True, 5) - 0.093) < 0.002     # EAGLE-3's own step, moved along the line


def test_an_mlp_probe_reads_its_layer_from_eagle3_s_captured_features():
    """A probe on layer 14's output reads the second block of EAGLE-3's features when vLLM captures layers
    (2, 15, 27) (each the input of that layer: the output of 1, 14, 26), with no hook in the target; a probe on a
    layer EAGLE-3 does not capture is refused, naming the layers it does."""
    from switchsd.core.probe import Probe
    target = _target()
    target.model.aux_hidden_state_layers = (2, 15, 27)
    gate = Gate(Probe(torch.tensor([1.0, 0.0]), layer=14, sublayer="mlp", tau=0.5), target, max_tokens=8)
    feats = torch.zeros(3, 6)                        # [T, 3 x d]: blocks for layers 1, 14, 26
    feats[0, 0], feats[1, 2], feats[2, 4] = 5.0, 5.0, -5.0
    assert [round(x, 2) for x in gate.scores(torch.tensor([0, 1, 2]), feats)] == [0.5, 0.99, 0.5]
    assert not any(n.post_attention_layernorm._forward_hooks for n in target.model.layers)
    odd = Gate(Probe(torch.tensor([1.0, 0.0]), layer=19, sublayer="mlp", tau=0.5), target, max_tokens=8)
    with pytest.raises(GateError, match=r"outputs of layers \[1, 14, 26\]"):
        odd.scores(torch.tensor([0]), feats)


def test_committed_sequences_include_the_step_s_accepted_drafts_and_next_token():
    """vLLM proposes before it books the step: the committed tokens come from its input batch up to the forward's
    first position, then the forward's rows up to the last accepted one, then the sampled token. A prefill chunk
    (request 1, positions 4..6 of a 7-token prompt) and a decode step with 2 of 3 drafts accepted (request 0)."""
    book = np.zeros((2, 16), dtype=np.int64)
    book[0, :6] = [1, 2, 3, 4, 5, 6]                 # request 0: 6 committed; this forward: 6 (pos 5) + drafts 7 8 9
    book[1, :7] = [9, 9, 9, 9, 8, 8, 8]              # request 1: prompt in the batch, the chunk 8 8 8 in the forward
    forward = np.array([6, 7, 8, 9, 8, 8, 8])
    positions = np.array([5, 6, 7, 8, 4, 5, 6])
    seqs = committed(book, np.array([0, 4]), np.array([2, 6]), forward, positions, np.array([70, 71]))
    assert seqs[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 70]         # drafts 7, 8 accepted, 9 rejected, then 70
    assert seqs[1].tolist() == [9, 9, 9, 9, 8, 8, 8, 71]


def test_a_probe_that_does_not_fit_the_served_model_is_refused(tmp_path):
    shipped = ROOT / "probes" / "smollm2-135m-instruct.safetensors"
    assert load_gate_probe(str(shipped), 576, 30).layer == 19
    with pytest.raises(GateError, match="hidden size 576 at layer 19; the served model has hidden size 4096"):
        load_gate_probe(str(shipped), 4096, 32)
    with pytest.raises(GateError, match="SWITCHSD_VLLM_GATE"):
        load_gate_probe(str(tmp_path / "missing.safetensors"), 576, 30)


def test_a_head_whose_layers_vllm_cannot_capture_is_refused():
    """vLLM captures each layer id once: a head with ids (1, 1, 1) gets one hidden state where its fc takes three (the
    first neural step would fail inside vLLM), and vLLM's default (2, L // 2, L - 3) reaches outside a 2-layer model."""
    from types import SimpleNamespace

    from switchsd.vllm.gate import check_capture
    target = lambda ids: SimpleNamespace(model=SimpleNamespace(aux_hidden_state_layers=ids))   # noqa: E731
    check_capture(target((2, 15, 27)), 30, None)
    check_capture(target((0, 1, 2)), 2, [0, 1, 2])
    with pytest.raises(GateError, match=r"takes 3 hidden states \(its eagle_aux_hidden_state_layer_ids \[1, 1, 1\]\)"
                                        r", and vLLM captures layers \[1\] of this 2-layer model"):
        check_capture(target([1]), 2, [1, 1, 1])
    with pytest.raises(GateError, match=r"vLLM's default ids\), and vLLM captures layers \[2, 1, -1\]"):
        check_capture(target((2, 1, -1)), 2, None)


@pytest.mark.vllm
@pytest.mark.skipif(not VENV.exists(), reason="vLLM's environment is missing: `make vllm` builds .venv-vllm")
def test_vllm_greedy_with_copy_and_switchsd_equals_no_speculation(tmp_path):
    out = tmp_path / "check.json"
    r = subprocess.run([str(VENV), "-m", "switchsd.vllm.check", "--out", str(out), "--max-tokens", "48"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["plugin_loaded"] and res["internals_missing"] == []
    for name in ("copy", "switchsd"):
        m = res["methods"][name]
        assert m["identical"] == res["n"] == 3, (name, m)
        assert m["counts"]["copy"] > 0, (name, m)         # it copied (the JSON echo)
    assert res["methods"]["switchsd"]["counts"]["neural"] > 0     # and left the story to EAGLE-3


@pytest.mark.vllm
@pytest.mark.skipif(not VENV.exists(), reason="vLLM's environment is missing: `make vllm` builds .venv-vllm")
def test_vllm_greedy_on_a_tiny_qwen3_equals_no_speculation(tmp_path):
    """vLLM runs the Qwen3 family natively: with the copy proposer and with SwitchSD (a random EAGLE-3 head behind
    the probe gate, whose hook reads the hidden states of Qwen3's layer) greedy outputs equal vLLM's own. The head
    reads three distinct layers (vLLM captures each once; `check_capture` holds them to the head at the first step)."""
    from families import qwen3_folder
    folder, head, probe = qwen3_folder(tmp_path, head_dim=64, aux=(0, 1, 2))
    out = tmp_path / "check.json"
    r = subprocess.run([str(VENV), "-m", "switchsd.vllm.check", "--model", str(folder), "--head", str(head),
                        "--probe", str(probe), "--out", str(out), "--max-tokens", "48"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    for name in ("copy", "switchsd"):
        m = res["methods"][name]
        assert m["identical"] == res["n"] == 3, (name, m)
    counts = res["methods"]["switchsd"]["counts"]
    assert counts["copy"] + counts["neural"] > 0, counts            # the gate ran on Qwen3's captured states
