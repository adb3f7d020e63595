"""Issue 41: every plan term says how it was obtained; the band around what the job needs
comes from the truth corpus's calibration part (bench/bands.py), never from the validation
part."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import memfit
from memfit.core._workload_load import bundled_names
from memfit.core.bands import (
    BASES,
    MIN_CASES,
    PROGRAM_CLASSES,
    Band,
    BandTable,
    basis_summary,
    load_bands,
    plan_interval,
    program_class,
)
from memfit.core.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> object:
    import band_derivation

    return band_derivation


@pytest.mark.parametrize("name", bundled_names())
def test_every_bundled_plan_has_a_basis_per_term_and_a_band_around_what_it_needs(
    name: str,
) -> None:
    try:
        plan = memfit.plan(name, gpu="RTX 4090", measure="recorded")
    except memfit.InfeasiblePlan:  # the variant that reproduces a report of an OOM
        plan = memfit.plan(name, gpu="B200", measure="recorded")
    assert set(plan.sources) == set(plan.breakdown)
    assert set(plan.sources.values()) <= set(BASES)
    data = plan.to_dict()
    assert data["sources"] == plan.sources
    assert data["predicted_low_bytes"] <= data["used_bytes"] <= data["predicted_high_bytes"]
    assert data["basis"].startswith("basis: ")
    # a note that names a term's basis says what the table says
    for note in plan.notes:
        if (said := re.match(r"(\w+) \(basis: (\w+)\)", note)) and said[1] in plan.sources:
            assert plan.sources[said[1]] == said[2], note


def test_terms_carry_the_basis_of_what_made_them() -> None:
    brax = memfit.plan("brax_humanoid_ppo", gpu="RTX 4070", measure="recorded")
    assert brax.sources["rollout_buffer"] == "recorded"  # Brax's compiled step, stored
    # the kernel images a step loads were measured on the H100 only: assumed on an Ada card
    assert brax.sources["cuda_context"] == "assumed"
    # measured in a torch process on the H100: fitted for a torch job there, assumed for JAX
    h100 = memfit.plan("brax_humanoid_ppo", gpu="H100", measure="recorded")
    assert h100.sources["cuda_context"] == "assumed"
    assert memfit.plan("dqn_fire_raster", gpu="H100").sources["cuda_context"] == "fitted"
    assert brax.sources["allocator_slack"] == "analytic"
    skrl = memfit.plan("skrl_isaaclab_ppo", gpu="RTX 4090", measure="recorded")
    fitted = [t for t, b in skrl.sources.items() if b == "fitted" and t != "cuda_context"]
    assert fitted, "the simulator's figures are fitted to published readings"
    dqn = memfit.plan("dqn_fire_raster", gpu="RTX 4070")
    assert dqn.sources["activations"] == "analytic"


def test_a_given_context_is_measured_not_fitted() -> None:
    from memfit.core.plan import plan_for_gpu
    from memfit.hardware.catalog import gpu

    plan = plan_for_gpu(load_workload("dqn_fire_raster"), gpu("RTX 4070"), context_bytes=0)
    assert plan.sources["cuda_context"] == "measured"


def test_the_hand_written_brax_ppo_band_reaches_the_measured_plan() -> None:
    """Issue 41's newcomer: the bundled Brax PPO without env:, backend: and measurements:,
    env_state_bytes as workload.md invites, on an RTX 4070."""
    measured = load_workload("brax_humanoid_ppo")
    data = measured.model_dump(exclude_none=True)
    for key in ("env", "backend", "measurements"):
        data.pop(key, None)
    hand = type(measured).model_validate(data)
    pins = {"num_envs": 4096, "batch_size": 1024, "num_minibatches": 32, "unroll_length": 20}
    a = memfit.plan(hand, gpu="RTX 4070", overrides=pins)
    m = memfit.plan(measured, gpu="RTX 4070", overrides=pins, measure="recorded")
    assert a.used_bytes < 0.9 * m.used_bytes  # the formula alone is well under
    assert a.sources["rollout_buffer"] == "analytic"
    low, high = a.band
    assert low <= a.used_bytes and high >= m.used_bytes  # its band reaches the measured one


def test_a_plan_whose_high_end_does_not_fit_says_only_the_estimate_fits() -> None:
    from dataclasses import replace

    plan = memfit.plan("dqn_fire_raster", gpu="RTX 4070")
    tight = replace(plan, budget_bytes=plan.predicted_bytes, pool_bytes=None)
    low, high = plan.band
    assert plan.high_fits and (high > plan.used_bytes or low == high)
    if high > plan.used_bytes:
        assert not tight.high_fits and tight.to_dict()["high_fits"] is False


def test_bands_table_lookups() -> None:
    table = BandTable(
        bands={
            "traced": Band(-0.01, 0.5, 10),
            "compiled": Band(-0.1, 0.2, 5),
            "analytic/ppo/brax": Band(0.0, 0.3, 9),
            "fitted/cuda_context": Band(0.0, 0.6, 3),
            "compiled/conv": Band(0.0, 4.0, 1),
        }
    )
    assert table.band("analytic", "ppo/brax") == Band(0.0, 0.3, 9)
    # no evidence for this formula: the formulas that were checked
    assert table.band("analytic", "vision") == Band(0.0, 0.3)
    # no evidence at all: the widest band, a program kind of its own left out
    assert table.band("assumed") == table.widest == Band(-0.1, 0.6)
    assert table.band("recorded") == table.bands["compiled"]  # a stored compile
    assert table.band("fitted", term="cuda_context") == Band(0.0, 0.6, 3)
    assert table.interval(1000, "traced") == (990, 1500)
    low, high = plan_interval(
        {"cuda_context": 100, "x": 1000, "jax_pool_unused": 5000},
        {"cuda_context": "fitted", "x": "traced", "jax_pool_unused": "analytic"},
        table=table,
    )
    assert (low, high) == (100 + 990, 160 + 1500)  # the pool's free part is not needed


def test_a_family_band_is_the_most_specific_with_enough_cases() -> None:
    table = BandTable(
        bands={
            "traced": Band(-0.1, 0.2, 40),
            "traced/reserved": Band(-0.1, 0.2, 20),
            "traced/reserved/conv": Band(-0.1, 0.2, 12),
            "traced/reserved/other": Band(-0.01, 0.01, 8),
            "traced/allocated": Band(-0.05, 0.05, 20),
            "traced/allocated/other": Band(0.0, 0.0, MIN_CASES - 1),
            "compiled": Band(-0.1, 0.02, 10),
            "compiled/conv": Band(-0.2, 0.5, 0),  # a program class, no evidence: the widest
        }
    )
    assert table.band("traced", "reserved/other") == Band(-0.01, 0.01, 8)
    assert table.band("traced", "reserved/conv") == Band(-0.1, 0.2, 12)
    # too few cases of its own: the parent's band, which covers them too
    assert table.band("traced", "allocated/other") == Band(-0.05, 0.05, 20)
    assert table.band("traced", "device/other") == table.bands["traced"]
    assert table.band("traced") == table.bands["traced"]
    # a compiled convolution is not a compiled MLP: never the basis's narrow band
    assert table.band("compiled", "conv") == Band(-0.2, 0.5, 0)
    assert table.band("compiled") == Band(-0.1, 0.02, 10)
    assert "compiled/conv" in PROGRAM_CLASSES
    # a plan's traced terms take the trace's family, its other terms the workload's
    low, high = plan_interval(
        {"activations": 1000, "slack": 100},
        {"activations": "traced", "slack": "compiled"},
        family="vision",
        table=table,
        basis_families={"traced": "reserved/other"},
    )
    assert (low, high) == (990 + 90, 1010 + 102)


def test_program_class_follows_the_traced_ops() -> None:
    assert program_class(["aten.convolution_backward", "aten.mm"]) == "conv"
    assert program_class(["aten.addmm", "aten._scaled_dot_product_flash_attention"]) == "other"
    assert program_class([]) == "other"


def test_derive_rolls_families_up_and_widens_a_program_class_without_evidence() -> None:
    bench = _bench()

    def row(case: str, family: str | None, predicted: int, truth: int, part: str = "calibration",
            basis: str = "traced") -> dict[str, object]:  # fmt: skip
        return {"case": case, "basis": basis, "family": family, "predicted": predicted,
                "truth": truth, "part": part}  # fmt: skip

    rows = [
        row("a", "reserved/conv", 100, 120),
        row("b", "reserved/conv", 100, 95),
        row("c", "reserved/other", 100, 101),
        row("d", "allocated/other", 100, 100),
        row("v", "reserved/conv", 100, 300, part="validation"),  # never moves a band
        row("e", "cuda_context", 100, 150, basis="fitted"),
        row("f", None, 100, 90, basis="fitted"),
        row("g", None, 100, 102, basis="compiled"),
    ]
    bands = bench.derive(rows)  # type: ignore[attr-defined]
    near = pytest.approx  # to 4 decimals, rounded outwards
    assert bands["traced/reserved/conv"] == near({"low": -0.05, "high": 0.2, "cases": 2}, abs=2e-4)
    assert bands["traced/reserved"] == near({"low": -0.05, "high": 0.2, "cases": 3}, abs=2e-4)
    assert bands["traced"] == near({"low": -0.05, "high": 0.2, "cases": 4}, abs=2e-4)
    # the context is a term of its own: the simulators' fitted band does not take it
    assert bands["fitted"] == near({"low": -0.1, "high": 0.0, "cases": 1}, abs=2e-4)
    assert bands["fitted/cuda_context"]["high"] == near(0.5, abs=2e-4)
    # no compiled convolution among the calibration rows: the widest band, by rule
    assert bands["compiled/conv"] == near({"low": -0.1, "high": 0.5, "cases": 0}, abs=2e-4)
    assert bands["compiled"]["cases"] == 1
    cov = bench.coverage(rows, bands, "validation")  # type: ignore[attr-defined]
    assert {c["basis"]: c["covered"] for c in cov} == {
        "traced": 0, "traced/reserved": 0, "traced/reserved/conv": 0, "traced, by family": 0,
    }  # fmt: skip


def test_a_row_with_alternatives_is_off_by_the_nearer_one_and_stands_apart() -> None:
    """A compiled figure with its program's two alternatives (Triton wins every GEMM fusion,
    cuBLAS wins them): its error is against the nearer one (none between them), and its
    band, ``compiled/alternatives/<family>``, does not roll up into ``compiled``."""
    bench = _bench()

    def row(
        case: str, family: str | None, predicted: int, truth: int,
        alternatives: list[int] | None = None, part: str = "calibration",
    ) -> dict[str, object]:  # fmt: skip
        out: dict[str, object] = {"case": case, "basis": "compiled", "family": family,
                                  "predicted": predicted, "truth": truth, "part": part}  # fmt: skip
        if alternatives is not None:
            out["alternatives"] = alternatives
        return out

    rows = [
        row("a", None, 100, 80),  # the figure alone: 20% over
        row("a", "alternatives/other", 100, 80, [82, 100]),  # 2% below the Triton figure
        row("b", None, 100, 90),
        row("b", "alternatives/other", 100, 90, [85, 100]),  # between the two: 0
        row("c", "alternatives/other", 100, 101, [100, 100]),  # no choice: +1%
        row("d", "alternatives/small_tuning", 100, 90, [100, 100]),
        row("v", "alternatives/other", 100, 50, [90, 100], part="validation"),
    ]
    derived = bench.derive(rows)  # type: ignore[attr-defined]
    near = pytest.approx
    assert derived["compiled"] == near({"low": -0.2, "high": 0.0, "cases": 2}, abs=2e-4)
    assert derived["compiled/alternatives/other"] == near(
        {"low": -2 / 82, "high": 0.01, "cases": 3}, abs=2e-4
    )
    assert derived["compiled/alternatives"] == near(
        {"low": -0.1, "high": 0.01, "cases": 4}, abs=2e-4
    )
    coverage = bench.coverage  # type: ignore[attr-defined]
    cov = {c["basis"]: c for c in coverage(rows, derived, "validation")}
    assert cov["compiled/alternatives/other"]["covered"] == 0
    # the band runs from below the lower alternative to above the higher one
    table = BandTable.from_dict({"bands": derived})
    lo = table.band("compiled", "alternatives/other").interval(90)[0]
    hi = table.band("compiled", "alternatives/other").interval(100)[1]
    assert cov["compiled/alternatives/other"]["half_width"] == pytest.approx((hi - lo) / 2 / 100)
    assert cov["compiled/alternatives, by family"]["cases"] == 1
    assert "compiled" not in cov  # the validation row is not a figure without alternatives


def test_basis_summary_orders_by_share() -> None:
    assert basis_summary({"a": 1, "b": 999}, {"a": "analytic", "b": "compiled"}) == (
        "basis: 100% compiled, <1% analytic"
    )


def test_the_committed_bands_come_from_the_calibration_rows_only() -> None:
    bench = _bench()
    evidence = json.loads((ROOT / "tests" / "data" / "band_evidence.json").read_text())
    rows = evidence["rows"]
    derived = bench.derive(rows)  # type: ignore[attr-defined]
    committed = json.loads((ROOT / "src" / "memfit" / "core" / "bands.json").read_text())
    assert committed["bands"] == derived
    assert committed["command"] == "python bench/bands.py"
    # a validation row never moves a band
    moved = [dict(r) for r in rows]
    for r in moved:
        if r["part"] == "validation":
            r["truth"] = r["truth"] * 10
    assert bench.derive(moved) == derived  # type: ignore[attr-defined]
    assert {r["part"] for r in rows} <= {"calibration", "validation", "fit"}
    assert load_bands().bands.keys() == derived.keys()


def test_the_split_is_deterministic() -> None:
    bench = _bench()
    part = bench.part_of  # type: ignore[attr-defined]
    names = [f"case{i}" for i in range(300)]
    parts = [part(n) for n in names]
    assert parts == [part(n) for n in names]
    assert 60 < parts.count("validation") < 140
    assert part("x", "calibration") == "fit"


def test_coverage_counts_what_the_band_covers() -> None:
    bench = _bench()
    rows = [
        {"case": "a", "basis": "traced", "family": None, "predicted": 100, "truth": 110,
         "part": "validation"},
        {"case": "b", "basis": "traced", "family": None, "predicted": 100, "truth": 200,
         "part": "validation"},
    ]  # fmt: skip
    cov = bench.coverage(rows, {"traced": {"low": 0.0, "high": 0.2, "cases": 3}}, "validation")  # type: ignore[attr-defined]
    assert cov == [{"basis": "traced", "cases": 2, "covered": 1, "half_width": pytest.approx(0.1)}]


def test_collecting_some_published_series_keeps_the_others() -> None:
    bench = _bench()
    mine = bench._mine  # type: ignore[attr-defined]
    bert = {"case": "hf_bert_large_v100/fp16", "collector": "published"}
    vit = {"case": "rasbt_vit_l16/01 fp32 batch 64", "collector": "published"}
    h100 = {"case": "h100/act_2cam_256@4", "collector": "traced"}
    assert mine(bert, "published", ["hf_bert_*", "liger_*"])
    assert not mine(vit, "published", ["hf_bert_*", "liger_*"])
    assert mine(vit, "published", ["*"]) and not mine(h100, "published", ["*"])
    assert mine(h100, "traced", ["*"])


def test_a_plans_traced_terms_take_the_traces_family_band(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan from a trace: its traced terms are at the allocated level, and a step with
    cuDNN convolutions takes the convolution band, not the MLPs' exact one."""
    from memfit.core.measured import MeasuredTerms
    from memfit.core.workload import parse_workload

    w = parse_workload(
        "family: offpolicy\nestimator: torch\nfactory: my_model:make_step\n"
        "observations: {vector: 16}\nnetworks: {q: {layers: [64, 4]}}\n"
        "knobs:\n  buffer_size: {choices: [1000]}\n  batch_size: {choices: [256]}\n"
    )
    plans = {}
    for family in ("allocated/conv", "allocated/other"):
        terms = MeasuredTerms(
            knob="batch_size", fixed_bytes={"parameters": 10 * 2**20},
            per_item_bytes=64 * 1024, source="torch fake-tensor trace", family=family,
        )  # fmt: skip
        monkeypatch.setattr("memfit.estimate.bridge.measure", lambda *_a, t=terms, **_k: t)
        plans[family] = memfit.plan(w, gpu="RTX 4090")
    conv, other = plans["allocated/conv"], plans["allocated/other"]
    assert conv.sources["activations"] == "traced" and conv.breakdown == other.breakdown
    table = load_bands()
    for p, family in ((conv, "allocated/conv"), (other, "allocated/other")):
        expected = plan_interval(p.breakdown, p.sources, "offpolicy",
                                 basis_families={"traced": family})  # fmt: skip
        assert p.band == expected
    diff = sum(
        table.interval(n, "traced", "allocated/conv")[1]
        - table.interval(n, "traced", "allocated/other")[1]
        for t, n in conv.breakdown.items()
        if conv.sources[t] == "traced"
    )
    assert conv.band[1] - other.band[1] == diff > 0  # the convolutions' band is the wider
