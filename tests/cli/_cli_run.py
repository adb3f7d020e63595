"""Running a memfit command in a test, and what a user's mistake must look like."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memfit.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``memfit ARGS``: the exit code, stdout and stderr."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    """``memfit ARGS``, which must succeed (exit 0): its stdout, read as JSON."""
    code, out, err = run(capsys, *args)
    assert code == 0, err
    return json.loads(out)


def user_error(code: int, err: str, *words: str) -> None:
    """A user's mistake, reported by the contract: exit 1, Error and Hint, no traceback."""
    assert code == 1, err
    assert "Error:" in err and "Hint:" in err, err
    assert "internal error" not in err and "Traceback" not in err, err
    for word in words:
        assert word in err, err
