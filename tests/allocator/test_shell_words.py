"""``allocator.shell.shell_words``: shlex's splitting (issue 21), in linear time."""

from __future__ import annotations

import random
import shlex

import pytest

from memfit.allocator.settings_check import check_shell
from memfit.allocator.shell import parse_shell_assignments, shell_words


def _shlex(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _outcome(split: object, line: str) -> tuple[str, object]:
    try:
        return "ok", split(line)  # type: ignore[operator]
    except ValueError as exc:
        return "error", str(exc)


def test_it_splits_every_line_as_shlex_does() -> None:
    rng = random.Random(21)
    alphabet = list("ab=:,;&|#'\"\\ \t$x")
    for _ in range(20000):
        line = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        assert _outcome(shell_words, line) == _outcome(_shlex, line), repr(line)


@pytest.mark.parametrize(
    "line",
    ["export A='x y' B=\"1\";echo # done", 'A="a\\"b\\\\c\\d"', "A=1&&B=2||C=3", "'' \"\""],
)
def test_known_lines(line: str) -> None:
    assert shell_words(line) == _shlex(line)


def test_a_line_of_200k_allocator_entries_is_read() -> None:
    # shlex took minutes on this line (each token grows one character at a time)
    conf = ",".join(f"max_split_size_mb:{i % 500 + 20}" for i in range(200_000))
    assert parse_shell_assignments(f"export PYTORCH_CUDA_ALLOC_CONF={conf}") == [
        (1, "PYTORCH_CUDA_ALLOC_CONF", conf)
    ]
    problems = check_shell(f"export PYTORCH_CUDA_ALLOC_CONF={conf[:2000]}")
    assert problems  # max_split_size_mb given many times is reported
