"""The public names in ``memfit.__all__`` all resolve, and ``import memfit`` stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import memfit


@pytest.mark.parametrize("name", memfit.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(memfit, name) is not None


def test_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        memfit.nope  # noqa: B018


def test_import_memfit_loads_no_framework() -> None:
    code = (
        "import sys, memfit; memfit.parse_bytes('1GiB'); "
        "print(','.join(m for m in ('torch', 'jax', 'pynvml') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""
