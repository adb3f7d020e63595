"""The multi-GPU truth corpus: well formed, split, and the calibration part rebuilt in CI."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import yaml

from memfit.hardware.nccl import COMM_BASE_BYTES

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "published_truth" / "multi_gpu" / "readings.yaml"


def _bench() -> ModuleType:
    import multi_gpu_readings

    return multi_gpu_readings


DOC = yaml.safe_load(DATA.read_text(encoding="utf-8"))


def test_two_parts_and_every_reading_sourced() -> None:
    assert set(DOC) == {"calibration", "validation"}
    ids = [r["id"] for part in DOC.values() for r in part]
    assert len(ids) == len(set(ids))
    for part in DOC.values():
        for reading in part:
            assert reading["source"]["quoted"].strip()
            assert reading["source"].get("url") or reading["source"].get("located") is False
            assert reading["quantity"] and reading["unit_bytes"] > 0


@pytest.mark.parametrize("reading", DOC["calibration"], ids=lambda r: r["id"])
def test_calibration_readings_within_fifteen_percent(reading: dict[str, object]) -> None:
    bench = _bench()
    [row] = bench.rows([reading])
    assert abs(row["error"]) <= 0.15, row


def test_the_doc_table_is_the_benchs() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    bench = _bench()
    for part in DOC.values():
        for row in bench.rows(part):
            assert f"| `{row['id']}` |" in text
            assert f"{row['error']:+.1%}" in text


def test_bucket_view_saving_is_the_gradients() -> None:
    """DDP keeps buckets as large as all gradients beside them; gradient_as_bucket_view makes
    the gradients views into the buckets, so it saves exactly that (reducer.cpp)."""
    bench = _bench()
    assert bench.gradient_bucket_bytes({"parameters": 1000, "param_bytes": 4}) == 4000
    assert bench.gradient_bucket_bytes({"parameter_bytes": 2**30}) == 2**30


#: Validation readings added by issue 44's kmgpu round, and how their sources would be cited.
_UNCITED = {
    "pytorch41954_resnet50_bucket_view": "pytorch#41954",
    "pytorch41954_roberta_bucket_view": "pytorch#41954",
    "returnn1469_stray_context": "returnn#1469",
    "returnn1469_own_device": "returnn#1469",
}


def test_new_validation_readings_were_fitted_to_nothing() -> None:
    """The rule the corpus is split by: a reading is calibration only when a memfit rule or
    figure was derived from it. These are validation, so no rule table cites them."""
    src = ROOT / "src" / "memfit"
    cited = "\n".join(
        p.read_text(encoding="utf-8") for p in [*src.rglob("rules*.json"), *src.rglob("*.py")]
    )
    ids = {r["id"] for r in DOC["validation"]}
    for reading_id, citation in _UNCITED.items():
        assert reading_id in ids
        assert citation not in cited


def test_a_torch_ranks_own_device_is_context_tensors_and_nccl() -> None:
    """A torch rank's own device: the context, its tensors in 2 MiB segments and NCCL's
    terms; over SHM (NCCL_P2P_LEVEL=LOC) the channel buffers are in host memory."""
    bench = _bench()
    setup = {
        "framework": "torch", "strategy": "ddp", "ranks": 2, "topology": "pcie",
        "gpu": "RTX 2080 Ti", "nccl": "2.18.1", "runtime": "torch=2.1.0,module_loading=eager",
        "tensor_bytes": 1,
    }  # fmt: skip
    shm = bench.predict(
        {"quantity": "device_used", "setup": {**setup, "nccl_env": {"NCCL_P2P_LEVEL": "LOC"}}}
    )
    p2p = bench.predict({"quantity": "device_used", "setup": setup})
    assert shm == (900 + 2) * 2**20 + COMM_BASE_BYTES  # NCCL 2.18: cudaMalloc, no structures
    assert p2p == shm  # a GeForce card refuses peer access over PCIe: SHM either way
    v100 = bench.predict({"quantity": "device_used", "setup": {**setup, "gpu": "V100"}})
    assert v100 > shm  # P2P keeps the channel buffers on the device


def test_the_v100_resnet_reading_is_validation_and_its_parts_add_up() -> None:
    """pytorch#64130 (8 x V100, torch 1.8, NCCL 2.7.8): the eager CUDA 10.2 context, the
    tensors the reading's entry works out (110 MiB) and one communicator over NVLink, whose
    cudaMalloc'd P2P connections are 12 MiB each (p2p.cc rounds each side to CUDA_IPC_MIN)."""
    bench = _bench()
    assert "pytorch64130_resnet18_ddp_v100" in [r["id"] for r in DOC["validation"]]
    assert "pytorch64130_resnet18_ddp_v100" not in [r["id"] for r in DOC["calibration"]]
    [reading] = [r for r in DOC["validation"] if r["id"] == "pytorch64130_resnet18_ddp_v100"]
    mib = 2**20
    nvlink = bench.predict(reading)
    assert nvlink == (880 + 110 + 12 * 2 * 12) * mib + COMM_BASE_BYTES
    pcie = bench.predict({**reading, "setup": {**reading["setup"], "topology": "pcie"}})
    assert nvlink - pcie == (12 - 2) * 2 * 12 * mib  # 12 NVLink channels against 2 on PCIe
