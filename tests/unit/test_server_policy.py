"""The per-step speculation-length policy: table interpolation, and K chosen from cost vs expected tokens."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdecode.server import service
from specdecode.server.scheduling.policy import (
    SMOLLM2_CPU_FP32,
    SMOLLM2_CPU_INT4,
    AcceptanceStats,
    CostTable,
    RowEstimate,
    SpecPolicy,
    StepCap,
    builtin_fits,
    builtin_table,
)
from specdecode.server.service import QUICK_QS, ServeConfig, _policy

# A CPU-like table: at batch 1 extra tokens are cheap; at batch 16 the pass grows ~linearly with tokens.
TABLE = CostTable(batches=(1, 16), qs=(1, 5), ms=((100.0, 140.0), (400.0, 1600.0)))


@pytest.mark.parametrize("batch,q,ms", [
    (1, 1, 100.0), (1, 5, 140.0), (1, 3, 120.0), (16, 5, 1600.0), (16, 3, 1000.0),
    (0, 1, 100.0),  # below the grid: clamped
    (1, 9, 180.0),  # beyond the grid: linear extrapolation
])
def test_cost_interpolates(batch, q, ms):
    assert TABLE.cost(batch, q) == pytest.approx(ms)


def _rows(n: int, alpha: float, p: float = 1.0, k: int = 4) -> list[RowEstimate]:
    return [RowEstimate(alpha, p, k) for _ in range(n)]


@pytest.mark.parametrize("batch,alpha,p,expected", [
    (1, 0.8, 1.0, 4),  # cheap extra tokens, good drafts: full K
    (1, 0.05, 1.0, 0),  # drafts never accepted: speculation costs 40% for nothing
    (1, 0.8, 0.1, 4),  # a drafter that rarely finds a draft costs nothing when it finds none
    (16, 0.8, 0.1, 0),  # ... but in a batch of 16 some row almost always drafts, and the block is padded
    (16, 0.6, 1.0, 0),  # compute-bound batch: K=1 costs 1.75x for 1.6x the tokens
    (16, 0.95, 1.0, 2),  # only near-certain drafts pay at batch 16, and a shorter one (K=2: 2.85 tokens, 2.5x)
])
def test_choose_k(batch, alpha, p, expected):
    policy = SpecPolicy(TABLE, max_k=4)
    assert policy.choose_k(batch, _rows(batch, alpha, p)) == expected


def test_choose_k_counts_plain_rows_and_draft_cost():
    policy = SpecPolicy(TABLE, max_k=4)
    assert policy.choose_k(4, []) == 0  # nobody speculates
    assert policy.choose_k(1, _rows(1, 0.8), draft_ms_per_k=0.0) == 4
    assert policy.choose_k(1, _rows(1, 0.8), draft_ms_per_k=200.0) == 0  # drafting dearer than it saves
    assert policy.choose_k(1, _rows(1, 0.9, k=2)) == 2  # a row's own K bounds the cap


def test_a_target_without_padding_pays_for_the_rows_it_drafts():
    """At batch 16, a rarely drafting prompt lookup (p 0.1, alpha 0.95) pads the whole block when padding is
    computed (K 0), but over a target that computes none it adds ~1.6 rows a step per unit of K: at K 4, 21.6
    tokens for 520 ms against 16 for 400."""
    padded, ragged = SpecPolicy(TABLE, max_k=4), SpecPolicy(TABLE, max_k=4, ragged=True)
    rows = _rows(16, 0.95, 0.1)
    assert padded.choose_k(16, rows) == 0 and ragged.choose_k(16, rows) > 0
    assert ragged.choose_k(16, _rows(16, 0.05)) == 0  # drafts never accepted still do not pay


@pytest.mark.parametrize("table", [SMOLLM2_CPU_FP32, SMOLLM2_CPU_INT4], ids=["fp32", "int4"])
def test_measured_table_turns_speculation_down_as_the_batch_grows(table):
    policy = SpecPolicy(table, max_k=5)
    ks = [policy.choose_k(b, _rows(b, 0.6, 0.7, 5)) for b in (1, 2, 4, 8, 16)]
    assert ks[0] > 0 and ks[-1] == 0
    assert ks == sorted(ks, reverse=True)


def test_the_int4_table_stops_drafting_at_a_smaller_batch_than_the_fp32_one():
    """Rows are compute in int4: at 4 rows and acceptance 0.6-0.7 drafting no longer pays there."""
    ks = {name: [SpecPolicy(table, max_k=5).choose_k(b, _rows(b, 0.6, 0.7, 5)) for b in (1, 2, 4, 8, 16)]
          for name, table in (("fp32", builtin_table(False)), ("int4", builtin_table(True)))}
    last = {name: max(b for b, k in zip((1, 2, 4, 8, 16), found) if k > 0) for name, found in ks.items()}
    assert last["int4"] < last["fp32"], ks


def test_acceptance_stats():
    stats = AcceptanceStats()
    policy = SpecPolicy(TABLE, prior_alpha=0.5, prior_weight=2.0)
    assert stats.estimate(policy, 4) == RowEstimate(0.5, 1.0, 4)  # the prior
    stats.observe(allowed_k=4, depth=4, accepted=4)  # 4 tried, 4 accepted
    stats.observe(allowed_k=4, depth=4, accepted=1)  # 2 tried (the second rejected), 1 accepted
    stats.observe(allowed_k=4, depth=0, accepted=0)  # no draft found
    stats.observe(allowed_k=0, depth=0, accepted=0)  # not allowed to draft: no evidence
    estimate = stats.estimate(policy, 4)
    assert estimate.alpha == pytest.approx((5 + 0.5 * 2) / (6 + 2))
    assert estimate.p_draft == pytest.approx((2 + 1.0 * 2) / (3 + 2))
    pooled = RowEstimate(0.1, 0.5, 4)  # the drafter's recent rows did badly: a new row starts there
    assert AcceptanceStats().estimate(policy, 4, pooled) == RowEstimate(0.1, 0.5, 4)
    assert stats.estimate(policy, 4, pooled).alpha == pytest.approx((5 + 0.1 * 2) / (6 + 2))


def test_evidence_decays_back_to_the_prior():
    """A row whose drafts were all rejected gets speculation switched off, then (with no new evidence) drifts
    back to the prior and is tried again."""
    policy = SpecPolicy(CostTable((1,), (1, 5), ((100.0, 300.0),)), max_k=4, memory=0.9)  # K=1 costs 1.5x
    stats = AcceptanceStats()
    for _ in range(10):
        stats.observe(allowed_k=4, depth=4, accepted=0, memory=policy.memory)
    assert policy.choose_k(1, [stats.estimate(policy, 4)]) == 0
    for steps in range(1, 200):  # noqa: B007 - the step it stopped at is checked after the loop
        stats.observe(allowed_k=0, depth=0, accepted=0, memory=policy.memory)
        if policy.choose_k(1, [stats.estimate(policy, 4)]) > 0:
            break
    assert 5 < steps < 60


def test_draft_length_applies_the_batch_cap_except_to_seeded_rows():
    """The scheduler's per-step cap must reach the rows (else the policy decides nothing); a seeded sampled row
    keeps its own K (its draws depend on K), and a row that does not speculate drafts nothing."""
    from specdecode.server.scheduling.scheduler import DraftLength

    policy_k = 6  # the engine's adaptive K for the row
    assert DraftLength(None, True).k(policy_k, cap=2) == 2  # the engine's K, capped
    assert DraftLength(4, True).k(policy_k, cap=3) == 3  # the request's K, capped
    assert DraftLength(4, True).k(policy_k, cap=0) == 0  # the policy turned speculation off
    assert DraftLength(4, True).k(policy_k, cap=9) == 4
    assert DraftLength(4, True, seeded=True).k(policy_k, cap=2) == 4
    assert DraftLength(4, False).k(policy_k, cap=2) == 0
    assert DraftLength(None, True).own(policy_k) == 6


SMOLLM2 = SimpleNamespace(hidden_size=576, num_hidden_layers=30, vocab_size=49152)
QWEN_1_5B = SimpleNamespace(hidden_size=1536, num_hidden_layers=28, vocab_size=151936)


def test_the_builtin_tables_describe_smollm2_only(tiny_target):
    assert builtin_fits(SMOLLM2)
    assert not builtin_fits(QWEN_1_5B) and not builtin_fits(tiny_target.config)
    assert not builtin_fits(SimpleNamespace())  # a config without these fields


def test_measured_uses_the_builtin_table_for_its_model():
    target = SimpleNamespace(config=SMOLLM2, packed_decoder=True)
    policy = _policy(ServeConfig(k_policy="measured"), target)
    assert policy.table is builtin_table(True) and policy.ragged


def test_measured_times_any_other_models_passes(tiny_target, capsys, monkeypatch, tmp_path):
    """SmolLM2's milliseconds priced the Qwen pair's drafting (timed online, in its own milliseconds) as a loss at
    every batch size, so the server never drafted for it: another model gets its own costs."""
    monkeypatch.setattr(service, "SAY_AFTER_S", 0.0)  # a tiny model's timing is quicker than a line is worth
    monkeypatch.setattr(service, "cache_root", lambda: tmp_path)
    policy = _policy(ServeConfig(k_policy="measured", max_batch=2), tiny_target)
    assert policy.table not in (SMOLLM2_CPU_INT4, SMOLLM2_CPU_FP32)
    assert (policy.table.batches, policy.table.qs) == ((1, 2), QUICK_QS)
    assert all(ms >= 0 for row in policy.table.ms for ms in row)
    assert "timed at start-up" in capsys.readouterr().err
    assert _policy(ServeConfig(k_policy="fixed"), tiny_target) is None


def test_measured_costs_serve_the_next_start_once_checked(tiny_target, capsys, monkeypatch, tmp_path):
    """The first start times the grid and keeps it (server/scheduling/cost_store.py); the next uses it once two cells
    timed again agree with it, and times the whole grid again when they do not."""
    monkeypatch.setattr(service, "SAY_AFTER_S", 0.0)
    monkeypatch.setattr(service, "cache_root", lambda: tmp_path)
    config = ServeConfig(k_policy="measured", max_batch=2)
    first = _policy(config, tiny_target).table
    assert "kept for the next start" in capsys.readouterr().err
    assert len(list((tmp_path / "pass-costs").glob("*.json"))) == 1
    cell = {(b, q): first.ms[i][j] / 1000 for i, b in enumerate(first.batches) for j, q in enumerate(first.qs)}
    spotted = []
    monkeypatch.setattr(service, "time_passes", lambda target, shapes, **_: spotted.append(shapes) or {
        shape: cell[shape] for shape in shapes})
    monkeypatch.setattr(service, "calibrate", lambda *a, **k: pytest.fail("a checked table is timed again"))
    assert _policy(config, tiny_target).table == first
    assert spotted == [[(2, 1), (1, 9)]]  # the grid's corners: most rows at one token, one row at most tokens
    assert "of an earlier start" in capsys.readouterr().err
    slower = {shape: 1.5 * seconds for shape, seconds in cell.items()}
    monkeypatch.setattr(service, "time_passes", lambda target, shapes, **_: {shape: slower[shape] for shape in shapes})
    again = CostTable(first.batches, first.qs, tuple(tuple(1.5 * v for v in row) for row in first.ms))
    monkeypatch.setattr(service, "calibrate", lambda *a, **k: again)
    assert _policy(config, tiny_target).table == again
    assert "a pass of 2 x 1 tokens took" in capsys.readouterr().err


# the Qwen 1.5B's verify passes on the 2-core CPU (least of 3 rounds, 300 cached tokens; docs/serving.md)
QWEN_CPU = CostTable(batches=(1, 4), qs=(1, 2, 3, 4, 6), ms=((24.5, 28.7, 36.3, 39.8, 53.4),
                                                              (41.0, 65.2, 100.1, 129.1, 188.2)))


def test_a_step_drafts_freely_only_where_a_models_passes_do_not_pay():
    """At 4 rows a draft model's tokens (~17 ms a pass over the rows) never pay against these verify passes, while
    drafts that cost no pass and are nearly always accepted do: the step drafts freely only, and a row whose
    drafter has no free drafts decodes plainly. At 1 row the model's drafts pay, and the step allows them. The
    free drafts are judged by their own estimates, not by the drafter's over all its drafts."""
    policy = SpecPolicy(QWEN_CPU, max_k=5, ragged=True)
    rows = _rows(4, 0.97, k=5)
    assert policy.choose_k(4, rows, draft_ms_per_k=17.0) == 0
    cap = policy.choose(4, rows, 17.0, rows)
    assert cap.free_only and cap.k > 0
    assert policy.choose(4, rows, 17.0, [None] * 4) == StepCap(0)  # no row can draft freely: plain decoding
    one = _rows(1, 0.9, k=5)
    assert policy.choose_k(1, one, 6.5) > 0 and policy.choose(1, one, 6.5, one) == StepCap(policy.choose_k(1, one, 6.5))
    assert policy.choose(4, rows, 17.0, _rows(4, 0.5, k=5)) == StepCap(0)  # its free drafts are rarely accepted
    assert policy.choose(4, rows, 0.0, rows) == StepCap(policy.choose_k(4, rows))  # nothing to save
    mixed = policy.choose(4, rows, 17.0, [rows[0], None, rows[2], None])  # two rows draft freely, two plainly
    assert mixed.free_only and mixed.k > 0
