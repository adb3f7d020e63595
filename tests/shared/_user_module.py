"""A user's module written for a test: importable by name from the (temporary) cwd."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest


def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str, source: str) -> str:
    """Write ``source`` as a module with a fresh name (``prefix`` + 8 hex digits) in
    ``tmp_path``, make that the cwd and put it on ``sys.path``; the module's name."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name
