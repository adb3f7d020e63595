"""Bands from evidence: how far each basis of a figure has been off on the truth corpus.

Every figure memfit plans with says how it was obtained (its basis: compiled, traced,
measured, recorded, fitted, analytic, assumed; :mod:`memfit.core.bands`). This script turns
the project's truth corpus into evidence rows (one per case: the basis, the predicted and the
true bytes, where the pair comes from), splits them deterministically into a calibration part
and a validation part, derives each basis's band from the calibration part only and writes it
to ``src/memfit/core/bands.json`` (what the planner reads), then reports, on the validation
part only, how often the band covered the truth and how wide it was.

    python bench/bands.py --collect traced,published,analytic,measured,fitted,compiled
        # recompute evidence rows into tests/data/band_evidence.json (minutes: traces)
    python bench/bands.py --collect "published:hf_bert_*+liger_*"
        # only these published series (shell patterns): parts can run side by side
    python bench/bands.py
        # derive src/memfit/core/bands.json from the calibration rows; tables of both parts
        # into bench/out/bands.md (docs/benchmarks.md shows them)

Evidence, by basis:

* ``traced``: the H100 entries of ``tests/data/gpu_truth/`` (memfit's trace of each torch
  workload for the card against the caching allocator's real allocated and reserved peaks,
  two rows per entry), and the published torch runs of ``tests/data/published_truth/*.yaml``
  (the traced figure against what the source measured). Each row's family is what the
  figure counts (``allocated``, ``reserved``, ``device``: the CUDA context included) and the
  step's program class (``conv`` where cuDNN convolutions run, whose workspaces an engine
  choice inside the library sizes; ``other``): ``traced/reserved/conv``. A family's band
  covers every calibration row below it, so ``traced/reserved`` and ``traced`` hold too.
* ``compiled``: memfit's figure for XLA programs compiled for the H100 without the card,
  against ``peak_bytes_in_use`` measured there (``tests/data/gpu_truth/jax_measured/``;
  recomputing needs the ``jax-cuda12-plugin`` extra, else the stored rows stay).
* ``measured``: the repeats of each published measured run against their median (a
  measurement's own spread).
* ``fitted``: the simulator figures (fitted on the readings marked ``calibration``) against
  the readings, the part of the reading that is the simulator's.
* ``analytic/ppo``: the PPO formula for Brax (a hand-written workload: ``env_state_bytes``
  and the networks, no measurements) against the same workload planned from its recorded
  measurements of Brax's compiled training step, over a grid of the knobs.

A row's part is a hash of its case name (one in three to validation), except where the
corpus has a split of its own: the H100 entries follow issue 48's cuDNN fit (its validation
entries never touched the workspace factors), a published run its series' ``part:``; a
simulator reading the simulator figures were fitted on is in neither part.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the split and the derivation live with the tests' shared support code
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

import _common
from band_derivation import _mine, coverage, derive, part_of

from memfit.core.bands import MIN_CASES

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "tests" / "data" / "band_evidence.json"
TABLE = ROOT / "src" / "memfit" / "core" / "bands.json"
H100 = ROOT / "tests" / "data" / "gpu_truth" / "nvidia-h100-80gb-hbm3"
KINDS = (
    "traced", "published", "compiled", "compiled_recorded", "measured", "fitted", "analytic",
    "context",
)  # fmt: skip
COMMAND = "python bench/bands.py"


def _row(
    case: str, basis: str, predicted: float, truth: float, source: str, *,
    family: str | None = None, role: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {
        "case": case,
        "basis": basis,
        "family": family,
        "predicted": round(predicted),
        "truth": round(truth),
        "part": part_of(case, role),
        "source": source,
    }


# --- evidence ----------------------------------------------------------------------------------


def _program(kernels: Iterable[str]) -> str:
    """The program class of a traced step, from the ops whose CUDA kernel the trace
    followed (:func:`memfit.core.bands.traced_family`)."""
    from memfit.core.bands import program_class

    return program_class(kernels)


def h100_split() -> tuple[set[str], set[str]]:
    """The H100 torch entries as issue 48's cuDNN fit split them (within each workload the
    entries sorted by batch alternate, calibration first: ``bench/cudnn_workspace_fit.py``):
    the convolution workspaces were fitted on the calibration entries, so their validation
    entries are validation here too."""
    import cudnn_workspace_fit

    names = [p.name.removesuffix(".json.gz") for p in H100.glob("*.json.gz")]
    return cudnn_workspace_fit.split(names)


def traced_rows() -> list[dict[str, Any]]:
    """The H100 torch entries: memfit's traced allocated and reserved peaks against the
    caching allocator's real ones (one trace per entry, two rows)."""
    import gpu_truth  # puts tests/shared (the corpus format) on sys.path
    import gpu_truth_replay as replay
    from truth_corpus import load_entry

    from memfit.estimate.torch.trace import estimate_torch

    calibration, _ = h100_split()
    rows = []
    for path in sorted(H100.glob("*.json.gz")):
        entry = load_entry(path)
        found = gpu_truth.factory_for(entry)
        if entry.kind != "torch" or found is None:
            continue
        factory, batch = found
        step = factory()
        est = estimate_torch(
            step.build, step.step, step.make_batch, [batch], device="cpu",
            gpu=replay._catalog_name(entry.gpu), runtime=replay.entry_runtime(entry),
        )  # fmt: skip
        point = est.points[0]
        part = "calibration" if entry.name in calibration else "validation"
        program = _program(est.kernels)
        for quantity, pred, real in (
            ("allocated", point.allocated_peak, entry.peaks.get("max_allocated")),
            ("reserved", point.reserved_peak, entry.peaks.get("max_reserved")),
        ):
            if not pred or not real:
                continue
            row = _row(f"h100/{entry.name}", "traced", pred, real,
                       f"tests/data/gpu_truth/nvidia-h100-80gb-hbm3 (max_{quantity})",
                       family=f"{quantity}/{program}")  # fmt: skip
            row["part"] = part
            rows.append(row)
            print(rows[-1], flush=True)
    return rows


#: A published run's quantity as the band's (``device_used`` counts the CUDA context).
QUANTITY = {"allocated_peak": "allocated", "reserved_peak": "reserved", "device_used": "device"}


def published_rows(series: Iterable[str] = ("*",)) -> list[dict[str, Any]]:
    """The published torch runs (of the series matching ``series``: shell patterns): the
    traced figure against the source's reading, in the part its series names (``part:`` of
    its data file: the rules were studied on the calibration series; the validation series
    never touched them)."""

    import published_runs
    import published_truth

    patterns = list(series)
    rows = []
    for run in published_truth.load_runs():
        if not any(fnmatch.fnmatch(run.series, p) for p in patterns):
            continue
        # the scratch the CUDA figures count (the reduced losses' buffers), as the published
        # truth's own comparison and a user's trace count it
        est = published_runs.trace(run)
        point = est.points[0]
        figure = {
            "device_used": point.device_used_peak,
            "reserved_peak": point.reserved_peak,
            "allocated_peak": point.allocated_peak,
        }[run.quantity]
        if not figure:
            continue
        row = _row(f"{run.series}/{run.name}", "traced", figure, run.measured_bytes,
                   f"{run.source} ({run.quantity})",
                   family=f"{QUANTITY[run.quantity]}/{_program(est.kernels)}")  # fmt: skip
        row["part"] = run.part
        rows.append(row)
        print(rows[-1], flush=True)
    return rows


def compiled_rows() -> list[dict[str, Any]]:
    """memfit's ``peak_bytes_in_use`` for each MLP step of the H100's floor probe, compiled
    deviceless for the card (needs the jax-cuda12-plugin extra)."""
    import xla_floor_probe

    from memfit.estimate.xla.step import estimate_jax

    stored = json.loads(xla_floor_probe.STORED.read_text(encoding="utf-8"))
    rows = []
    for row in stored["rows"]:
        if "error" in row or not row["step"].startswith("mlp"):
            continue
        _, batch, width, depth = row["step"].split(":")
        fn, shapes = xla_floor_probe.mlp_step(int(batch), int(width), int(depth))
        est = estimate_jax(
            fn, *shapes, gpu=stored["device"], jaxlib=stored["jax"],
            environ={"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_FLAGS": row["xla_flags"]},
        )  # fmt: skip
        rows.append(
            _row(f"h100/{row['step']}/{row['variant']}", "compiled", est.peak_bytes_in_use,
                 row["after_step"]["peak_bytes_in_use"],
                 "tests/data/gpu_truth/jax_measured (xla_floor_probe)")
        )  # fmt: skip
    return rows


#: The H100's recorded XLA steps (``tests/data/gpu_truth/jax_measured/``, jaxlib 0.11.2): the
#: floor probe's MLP steps under its four main variants and the device-compile steps of
#: ``bench/xla_deviceless.py``. Until 2026-11-29 12:50 UTC memfit's figures were the ones
#: docs/benchmarks.md recorded ("On a real H100 (issue 30)", "cuBLAS calls in XLA's
#: autotuning", "Compiled convolutions and sorts"); they are recomputed now (the
#: ``jax-cuda12-plugin`` extra compiles them deviceless for the card), with the program's
#: alternatives (issue 41: the peak if every tunable GEMM fusion stays Triton, and if cuBLAS
#: wins them).
FLOOR_VARIANTS = ("default", "autotune_level=0", "triton_gemm=false", "redzone_padding=0")
DEVICELESS_STEPS = (
    "mlp:4096", "mlp:65536", "mlp:262144", "matmul:8192", "permute:1048576", "conv:64",
)  # fmt: skip
JAX_MEASURED = ROOT / "tests" / "data" / "gpu_truth" / "jax_measured"


def _recorded_steps() -> list[tuple[str, Any, tuple[Any, ...], dict[str, str], float]]:
    """``(case, step, shapes, environ, measured bytes)`` of each recorded H100 step. The
    permutation's measured figure is one step's: the bench's loop (``out = fn(*args)`` five
    times) held the last step's 64 MiB output while the next ran, its peak 222,299,136 B
    being the arguments, two outputs and the temporaries to the byte; memfit's figure is one
    call's."""
    from xla_probe_step import make_step, mlp_step

    probe = json.loads((JAX_MEASURED / "h100_jaxlib0.11.2_floor_probe.json").read_text("utf-8"))
    device = json.loads((JAX_MEASURED / "h100_jaxlib0.11.2_xla_deviceless.json").read_text("utf-8"))
    out = []
    for row in probe["rows"]:
        if "error" in row or not row["step"].startswith("mlp:"):
            continue
        if row["variant"] not in FLOOR_VARIANTS:
            continue
        _, batch, width, depth = row["step"].split(":")
        fn, shapes = mlp_step(int(batch), int(width), int(depth))
        environ = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_FLAGS": row["xla_flags"]}
        case = f"floor/{row['step'][4:]}/{row['variant']}"
        out.append((case, fn, shapes, environ, float(row["after_step"]["peak_bytes_in_use"])))
    for row in device["rows"]:
        if row["step"] not in DEVICELESS_STEPS:
            continue
        kind, size = row["step"].split(":")
        fn, shapes = make_step(kind, int(size))
        measured = float(row["measured"]["after_steps_peak"])
        if kind == "permute":  # one step: the loop's held output taken off
            measured -= row["measured"]["analysis"]["output_size_in_bytes"]
        environ = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        out.append((f"deviceless/{row['step']}", fn, shapes, environ, measured))
    return out


def compiled_recorded_rows() -> list[dict[str, Any]]:
    """memfit's ``peak_bytes_in_use`` for each recorded H100 step (:func:`_recorded_steps`),
    compiled deviceless for the card with its jaxlib and flags, against what the card
    measured. A convolution and a sort are programs of their own (cuDNN's autotuning, CUB's
    scratch: ``compiled/conv``, ``compiled/sort``); every other step gives two rows: its
    figure (``compiled``, the band of a figure that does not know its alternatives) and the
    same figure with its program's alternatives (``compiled/alternatives/<family>``:
    :attr:`memfit.estimate.xla.step.JaxEstimate.alternatives`)."""
    from memfit.estimate.xla.gpu import gpu_target_missing
    from memfit.estimate.xla.step import estimate_jax

    missing = gpu_target_missing()
    if missing:
        raise SystemExit(
            "compiled_recorded needs XLA's GPU compiler (the gpu-target extra): "
            + "; ".join(missing) + ". The stored rows stay."
        )  # fmt: skip
    source = "tests/data/gpu_truth/jax_measured (H100, jaxlib 0.11.2): peak_bytes_in_use"
    rows = []
    for case, fn, shapes, environ, measured in _recorded_steps():
        est = estimate_jax(
            fn, *shapes, gpu="NVIDIA H100 80GB HBM3", jaxlib="0.11.2", environ=environ
        )
        point = int(est.peak_bytes_in_use or 0)
        rows.append(_row(f"h100/{case}", "compiled", point, measured, source, family=est.program))
        if est.program is None and est.alternatives_family is not None:
            ends = {n: (lo, hi) for n, lo, hi in est.alternatives}
            low, high = ends.get("peak_bytes_in_use", (point, point))
            row = _row(f"h100/{case}", "compiled", point, measured, source,
                       family=f"alternatives/{est.alternatives_family}")  # fmt: skip
            row["alternatives"] = [int(low), int(high)]
            rows.append(row)
        print(rows[-1], flush=True)
    return rows


def measured_rows() -> list[dict[str, Any]]:
    """Each repeat of a published measured run against the run's figure (the median)."""
    import yaml

    rows = []
    for path in sorted((ROOT / "tests" / "data" / "published_truth").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for item in data.get("runs") or []:
            figure = item.get("measured_bytes")
            for i, rep in enumerate(item.get("repeats") or []):
                if figure:
                    rows.append(
                        _row(f"{path.stem}/{item['name']}#{i}", "measured", figure, rep,
                             f"{data['source']['url']} (repeats)")
                    )  # fmt: skip
    return rows


def fitted_rows() -> list[dict[str, Any]]:
    """The simulator readings: the simulator's fitted terms against the reading less what
    memfit plans besides them."""
    import simulator_truth

    import memfit

    rows = []
    for run in simulator_truth.load_runs():
        workload = simulator_truth.workload_of(run)
        plan = memfit.plan(
            workload, gpu=simulator_truth.gpu_of(run), overrides=dict(workload.settings),
            margin=0.0, runtime=run.runtime or None, measure="recorded",
        )  # fmt: skip
        fitted = sum(b for t, b in plan.breakdown.items() if plan.sources.get(t) == "fitted")
        rest = plan.predicted_bytes - fitted
        if fitted <= 0:
            continue
        rows.append(
            _row(f"{run.series}/{run.name}", "fitted", fitted, run.measured_bytes - rest,
                 f"{run.source} (device used, less memfit's other terms)",
                 role=run.role)
        )  # fmt: skip
    return rows


#: The knob grid of the PPO formula against Brax's recorded measurements (issue 41, item 3).
PPO_GRID = {
    "num_envs": (1024, 2048, 4096, 8192, 16384, 32768, 65536),
    "batch_size": (256, 512, 1024, 2048),
    "num_minibatches": (8, 16, 32),
    "unroll_length": (10, 20, 30),
}


def analytic_rows() -> list[dict[str, Any]]:
    """The ``ppo`` formula for Brax (the bundled workload without ``env:`` and
    ``measurements:``) against the same workload from its recorded measurements, term sums
    without context and workspace, over :data:`PPO_GRID` (valid points only)."""
    import itertools

    from memfit.core.constraints import check
    from memfit.core.evaluate import evaluate
    from memfit.core.workload import load_workload

    measured = load_workload("brax_humanoid_ppo")
    data = measured.model_dump(exclude_none=True)
    for key in ("env", "backend", "measurements"):  # as docs/workload.md invites
        data.pop(key, None)
    analytic = type(measured).model_validate(data)
    rows = []
    names = list(PPO_GRID)
    for combo in itertools.product(*(PPO_GRID[n] for n in names)):
        values = {**measured.default_values(), **dict(zip(names, combo, strict=True))}
        pins = {n: values[n] for n in measured.knobs}
        if [v for v in check(measured, pins) if not v.rule.startswith("knobs.")]:
            continue
        a = evaluate(analytic, values)
        m = evaluate(measured, values)
        case = "brax_humanoid_ppo/" + ",".join(
            f"{n}={v}" for n, v in zip(names, combo, strict=True)
        )
        rows.append(
            _row(case, "analytic", a.reserved_bytes, m.reserved_bytes,
                 "the bundled brax_humanoid_ppo's recorded measurements (memfit plan "
                 "brax_humanoid_ppo --measure recorded)", family="ppo/brax")
        )  # fmt: skip
    return rows


def context_rows() -> list[dict[str, Any]]:
    """The CUDA context: memfit's figure for the H100 and each entry's runtime against what
    NVML counted for the process beyond the caching allocator's reserved peak (one row per
    workload: its entries share one figure)."""
    import gzip

    from memfit.hardware.catalog import gpu
    from memfit.hardware.runtime import cuda_context, parse_runtime

    rows = []
    seen = set()
    for path in sorted(H100.glob("*.json.gz")):
        entry = json.loads(gzip.decompress(path.read_bytes()))
        peaks, env = entry["peaks"], entry["environment"]
        if entry["kind"] != "torch" or entry["workload"] in seen or "nvml_used" not in peaks:
            continue
        seen.add(entry["workload"])
        runtime = parse_runtime(
            {"torch": env["torch"].split("+")[0], "cuda": env["cuda"], "driver": env["driver"]}
        )
        predicted = cuda_context(gpu(env["gpu_name"]), runtime).bytes
        rows.append(
            _row(f"h100/context/{entry['workload']}", "fitted", predicted,
                 peaks["nvml_used"] - peaks["max_reserved"],
                 "tests/data/gpu_truth/nvidia-h100-80gb-hbm3 (nvml_used - max_reserved)",
                 family="cuda_context")
        )  # fmt: skip
    return rows


COLLECTORS = {
    "context": context_rows,
    "compiled_recorded": compiled_recorded_rows,
    "traced": traced_rows,
    "published": published_rows,
    "compiled": compiled_rows,
    "measured": measured_rows,
    "fitted": fitted_rows,
    "analytic": analytic_rows,
}


def load_evidence() -> dict[str, Any]:
    if EVIDENCE.exists():
        data: dict[str, Any] = json.loads(EVIDENCE.read_text(encoding="utf-8"))
        return data
    return {"collected": {}, "rows": []}


def _write_evidence(evidence: dict[str, Any]) -> None:
    """The evidence file, one row a line (small diffs when a kind is collected again)."""
    rows = ",\n".join(json.dumps(r, sort_keys=True) for r in evidence["rows"])
    collected = json.dumps(evidence["collected"], indent=1, sort_keys=True)
    EVIDENCE.write_text(f'{{"collected": {collected},\n"rows": [\n{rows}\n]}}\n', encoding="utf-8")


def collect(kinds: Iterable[str]) -> list[dict[str, Any]]:
    """Recompute the rows of ``kinds`` and store them beside the others. ``published:P+Q``
    recomputes only the published series matching the shell patterns ``P`` and ``Q`` (the
    traces take minutes each: the series can be collected in parts, side by side)."""
    for spec in kinds:
        kind, _, chosen = spec.partition(":")
        if kind not in COLLECTORS or (chosen and kind != "published"):
            raise SystemExit(f"unknown evidence kind {spec!r}: one of {', '.join(KINDS)}")
        patterns = chosen.split("+") if chosen else ["*"]

        fresh = published_rows(patterns) if kind == "published" else COLLECTORS[kind]()
        evidence = load_evidence()  # read again: another kind may have been stored since
        evidence["rows"] = [r for r in evidence["rows"] if not _mine(r, kind, patterns)]
        evidence["rows"].extend({**r, "collector": kind} for r in fresh)
        if kind == "published" and chosen:
            evidence["collected"].pop(kind, None)  # the parts say when each was collected
        evidence["collected"][spec] = (
            f"{_common.utc_minute()}, python bench/bands.py --collect {spec}"
        )
        _write_evidence(evidence)
    rows: list[dict[str, Any]] = load_evidence()["rows"]
    return rows


# --- bands -------------------------------------------------------------------------------------


def markdown(cal: list[dict[str, Any]], val: list[dict[str, Any]], bands: dict[str, Any]) -> str:
    """Both parts' coverage per band, a line a band (and ``<basis>, by family``: each row by
    its own family's band)."""
    lines = [
        f"{_common.utc_minute()}, 2-core development VM, no GPU, `{COMMAND}` (evidence: "
        "`tests/data/band_evidence.json`, each kind's command in its `collected`).\n",
        "| band | truth / estimate - 1 | calibration cases | covered | mean half-width "
        "| validation cases | covered | mean half-width |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    empty = {"cases": 0, "covered": 0, "half_width": math.nan}
    cals = {c["basis"]: c for c in cal}
    vals = {c["basis"]: c for c in val}

    def cells(c: dict[str, Any]) -> str:
        if not c["cases"]:
            return "0 | - | -"
        return f"{c['cases']} | {c['covered'] / c['cases']:.0%} | {c['half_width']:.1%}"

    def leaves(prefix: str) -> int:  # the families below ``prefix`` with a band of their own
        return sum(
            1 for key in bands
            if key.startswith(f"{prefix}/") and not any(k.startswith(f"{key}/") for k in bands)
        )  # fmt: skip

    for key in sorted({*bands, *cals, *vals}):
        if key.endswith(", by family") and leaves(key.split(",")[0]) < 2:
            continue  # one family: its own line says it
        b = bands.get(key)
        if key.endswith(", by family"):
            text = "each row by its family's band"
        elif b is None:
            text = "(no band: its basis's)"
        elif b["cases"] == 0:
            text = f"{b['low']:+.1%} .. {b['high']:+.1%} (no calibration case: the widest, by rule)"
        elif b["cases"] < MIN_CASES:
            text = f"{b['low']:+.1%} .. {b['high']:+.1%} (under {MIN_CASES} cases: its parent's)"
        else:
            text = f"{b['low']:+.1%} .. {b['high']:+.1%}"
        lines.append(
            f"| {key} | {text} | {cells(cals.get(key, empty))} | {cells(vals.get(key, empty))} |"
        )
    return "\n".join(lines) + "\n"


def alternatives_markdown(rows: list[dict[str, Any]], bands: dict[str, Any]) -> str:
    """Each compiled step with its program's alternatives: what the card measured, memfit's
    figure if Triton wins every tunable GEMM fusion and if cuBLAS wins them, the band of its
    family around both, and whether it covered the card (MiB)."""
    from band_derivation import _ends

    from memfit.core.bands import BandTable

    table = BandTable.from_dict({"bands": bands})
    lines = [
        "| step | part | family | measured | if Triton wins | if cuBLAS wins | band | covered |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        if not row.get("alternatives"):
            continue
        low, high = _ends(row)
        band = table.band(row["basis"], row["family"])
        lo, hi = band.interval(round(low))[0], band.interval(round(high))[1]
        mib = [f"{n / 2**20:,.1f}" for n in (row["truth"], low, high, lo, hi)]
        lines.append(
            f"| {row['case'].removeprefix('h100/')} | {row['part']} | "
            f"{row['family'].removeprefix('alternatives/')} | {mib[0]} | {mib[1]} | {mib[2]} | "
            f"{mib[3]} .. {mib[4]} | {'yes' if lo <= row['truth'] <= hi else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--collect", help="recompute these evidence kinds first: " + ",".join(KINDS)
    )
    args = parser.parse_args(argv)
    if args.collect:
        collect(k.strip() for k in args.collect.split(",") if k.strip())
    evidence = load_evidence()
    rows = evidence["rows"]
    bands = derive(rows)
    TABLE.write_text(
        json.dumps(
            {
                "command": COMMAND,
                "derived": _common.utc_minute(),
                "evidence": "tests/data/band_evidence.json (calibration rows only)",
                "collected": evidence["collected"],
                "bands": bands,
            },
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    text = markdown(
        coverage(rows, bands, "calibration"), coverage(rows, bands, "validation"), bands
    )
    text += "\n" + alternatives_markdown(rows, bands)
    _common.write_results("bands", {"bands": bands}, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
