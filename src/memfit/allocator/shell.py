"""Shell text read as a shell reads it: words (``shlex``'s splitting, in linear time) and the
variable assignments a script makes (``export X=...``, ``X=... cmd``, PowerShell's
``$env:X = ...``), for checking the allocator settings a user's launch script sets."""

from __future__ import annotations

import re

from memfit.errors import ConfigError

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


_PS_ASSIGN = re.compile(r"""^\s*\$env:([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(["']?)(.*?)\2\s*;?\s*$""")


_PLAIN_RUN = re.compile(r"[^ \t\r\n;&|#'\"\\]+")


_PUNCT_RUN = re.compile(r"[;&|]+")


_DQ_RUN = re.compile(r'[^"\\]+')


def shell_words(line: str) -> list[str]:
    """Split one line as ``shlex.shlex(line, posix=True, punctuation_chars=";&|")`` with
    ``whitespace_split`` and ``#`` comments does, in time linear in the line's length.

    ``shlex`` builds each token by adding one character at a time to an attribute, which
    is quadratic in the token's length: a 200,000-entry ``PYTORCH_CUDA_ALLOC_CONF`` line
    took minutes. Quotes are removed as a POSIX shell does; runs of ``;``, ``&`` and ``|``
    are tokens of their own; a ``#`` starts a comment.

    Raises:
        ValueError: ``"No closing quotation"`` or ``"No escaped character"``, as ``shlex``.

    >>> shell_words("export A='x y' B=1;echo # done")
    ['export', 'A=x y', 'B=1', ';', 'echo']
    """
    words: list[str] = []
    buf: list[str] = []
    in_word = False
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in " \t\r\n":
            if in_word:
                words.append("".join(buf))
                buf, in_word = [], False
            i += 1
        elif c in ";&|":
            if in_word:
                words.append("".join(buf))
                buf, in_word = [], False
            match = _PUNCT_RUN.match(line, i)
            assert match is not None
            words.append(match.group())
            i = match.end()
        elif c == "#":
            break  # a comment, at the start of a word or inside one (as shlex reads it)
        elif c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise ValueError("No closing quotation")
            buf.append(line[i + 1 : end])
            in_word, i = True, end + 1
        elif c == '"':
            in_word, i = True, i + 1
            while True:
                if i >= n:
                    raise ValueError("No closing quotation")
                d = line[i]
                if d == '"':
                    i += 1
                    break
                if d == "\\":
                    if i + 1 >= n:
                        raise ValueError("No escaped character")
                    following = line[i + 1]
                    buf.append(following if following in '"\\' else d + following)
                    i += 2
                    continue
                match = _DQ_RUN.match(line, i)
                assert match is not None
                buf.append(match.group())
                i = match.end()
        elif c == "\\":
            if i + 1 >= n:
                raise ValueError("No escaped character")
            buf.append(line[i + 1])
            in_word, i = True, i + 2
        else:
            match = _PLAIN_RUN.match(line, i)
            assert match is not None
            buf.append(match.group())
            in_word, i = True, match.end()
    if in_word:
        words.append("".join(buf))
    return words


def parse_shell_assignments(text: str) -> list[tuple[int, str, str | None]]:
    """Environment assignments in a shell snippet, in order: ``(line, name, value)``.

    Understands ``export A=1 B=2``, ``A=1`` (also as a command prefix), ``unset A``
    (value ``None``), ``env A=1 cmd``, fish's ``set -gx A 1`` / ``set -e A`` and PowerShell's
    ``$env:A = "1"``. Quotes are removed as the shell would.

    Raises:
        ConfigError: When a line cannot be split (an unclosed quote); ``key_path`` names the
            line.

    >>> parse_shell_assignments("export A=1 B='x y'\\nset -gx C 3")
    [(1, 'A', '1'), (1, 'B', 'x y'), (2, 'C', '3')]
    """
    found: list[tuple[int, str, str | None]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        ps = _PS_ASSIGN.match(stripped)
        if ps:
            found.append((lineno, ps.group(1), ps.group(3)))
            continue
        try:
            tokens = shell_words(stripped)
        except ValueError as exc:
            raise ConfigError(
                f"cannot read the line: {exc}",
                key_path=f"line {lineno}",
                hint="close the quote",
            ) from exc
        found.extend(_assignments_in_tokens(lineno, tokens))
    return found


def _assignments_in_tokens(lineno: int, tokens: list[str]) -> list[tuple[int, str, str | None]]:
    out: list[tuple[int, str, str | None]] = []
    command_start = True
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in (";", "&&", "||", "|", "&"):
            command_start = True
            i += 1
            continue
        if command_start and tok in ("export", "declare", "typeset", "env", "local"):
            i += 1
            while i < len(tokens) and tokens[i].startswith("-"):
                i += 1
            continue
        if command_start and tok == "unset":
            i += 1
            while i < len(tokens) and tokens[i] not in (";", "&&", "||", "|", "&"):
                if not tokens[i].startswith("-"):
                    out.append((lineno, tokens[i], None))
                i += 1
            continue
        if command_start and tok == "set":
            args: list[str] = []
            i += 1
            while i < len(tokens) and tokens[i] not in (";", "&&", "||", "|", "&"):
                args.append(tokens[i])
                i += 1
            flags = [a for a in args if a.startswith("-")]
            rest = [a for a in args if not a.startswith("-")]
            erase = "--erase" in flags or any(
                "e" in f.lstrip("-") for f in flags if not f.startswith("--")
            )
            if erase and rest:
                out.append((lineno, rest[0], None))
            elif rest and any("x" in f for f in flags):
                out.append((lineno, rest[0], " ".join(rest[1:])))
            continue
        match = _ASSIGN.match(tok)
        if command_start and match:
            out.append((lineno, match.group(1), match.group(2)))
            i += 1
            continue
        command_start = False
        i += 1
    return out
