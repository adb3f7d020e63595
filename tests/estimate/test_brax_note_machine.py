"""Issue 41, item 8: no note claims a device the planning machine does not have."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit.core.workload import load_workload
from memfit.estimate import brax_measure


def test_the_note_names_the_target_compile_not_a_device_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    versions = {"brax": "9.9", "jax": "9.9", "jaxlib": "9.9"}
    monkeypatch.setattr(brax_measure, "installed_versions", lambda: versions)
    workload = load_workload("brax_humanoid_ppo")
    _, notes = brax_measure.resolve_measurements(
        workload, "auto", directory=tmp_path, gpu="RTX 4070"
    )
    note = notes[-1]
    assert "this machine has brax 9.9, jax 9.9, jaxlib 9.9: --measure fresh" in note
    # the card is what a fresh measurement would compile for, not a device of this machine
    assert " on cuda" not in note.split("--measure fresh")[0]
