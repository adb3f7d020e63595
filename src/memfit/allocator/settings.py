"""Allocator configuration for PyTorch and JAX, in one pure place: read, validate, recommend.

PyTorch reads ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF`` (comma-separated
``key:value`` options) once, when CUDA is first used; JAX reads ``XLA_PYTHON_CLIENT_*`` when
it starts its GPU backend. This module holds everything memfit knows about those settings,
as functions of plain data (nothing here reads or writes the process environment, imports
torch or JAX, or applies anything; :mod:`memfit.runtime.allocator_env` applies them):

* the one reading of each setting: :func:`read_jax_env` (what JAX's client will do with
  ``XLA_PYTHON_CLIENT_PREALLOCATE``, the memory fraction and the allocator) and
  :func:`torch_allocator_options` (expandable segments and ``max_split_size`` from a torch
  string, for the allocator replay);
* validation: :func:`check_torch_conf`, :func:`check_jax_env`, :func:`check_environment` and
  :func:`check_shell` (which also catches a variable exported twice, where the second
  silently replaces the first); every problem has a code and names the variable and option;
* recommendations per use (:func:`recommend`: ``training``, ``inference``, ``shared-gpu``),
  each with a one-line reason, the settings a planned workload runs with
  (:func:`workload_settings`, whose XLA fraction is the one memfit recommends everywhere:
  :func:`memfit.allocator.xla_fraction.recommended_xla_fraction`), and shell snippets
  (:func:`render_shell`).

The option table follows PyTorch's ``c10/core/AllocatorConfig`` and
``c10/cuda/CUDAAllocatorConfig.h`` (2.13): booleans are exactly ``True`` / ``False``,
``max_split_size_mb`` must be more than 20, ``garbage_collection_threshold`` in (0, 1),
``roundup_power2_divisions`` a power of two or a ``[size:divisions, ..., >:divisions]``
list. JAX's follow ``jaxlib/xla_client.py`` (0.10, ``generate_pjrt_gpu_plugin_options``):
the allocator is one of ``default``, ``platform``, ``bfc``, ``cuda_async``, ``vmm`` (read in
lower case); only ``false`` / ``False`` / ``0`` turn preallocation off (``no`` or ``FALSE``
leave it on); ``XLA_CLIENT_MEM_FRACTION`` is read first and setting both fraction variables
stops the backend from starting.

>>> [p.code for p in check_torch_conf("expandable_segments:true")]
['bad-value']
>>> [p.code for p in check_shell('''export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
... export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128''')]
['exported-twice']
>>> read_jax_env({"XLA_PYTHON_CLIENT_PREALLOCATE": "no"}).preallocate
True
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memfit._plain import plain_fields
from memfit.allocator.xla_fraction import recommended_xla_fraction
from memfit.errors import ConfigError
from memfit.hardware.catalog import GpuSpec

__all__ = [
    "JAX_VARIABLES",
    "PROFILES",
    "SHELLS",
    "TORCH_OPTIONS",
    "TORCH_VARIABLES",
    "JaxAllocator",
    "Problem",
    "Recommendation",
    "Setting",
    "check_environment",
    "check_jax_env",
    "check_shell",
    "check_torch_conf",
    "parse_shell_assignments",
    "parse_torch_conf",
    "read_jax_env",
    "recommend",
    "render_shell",
    "torch_allocator_options",
    "workload_settings",
]

#: The two names PyTorch reads its allocator options from.
TORCH_VARIABLES: tuple[str, str] = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")

#: The JAX / XLA variables checked here.
JAX_VARIABLES: tuple[str, ...] = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)

#: Use profiles :func:`recommend` knows.
PROFILES: tuple[str, ...] = ("training", "inference", "shared-gpu")

#: Shells :func:`render_shell` writes for.
SHELLS: tuple[str, ...] = ("bash", "fish", "powershell")

_BOOL = "bool"
_INT_GT20 = "int>20"
_INT_GE20 = "int>=20"
_INT_POS = "int>0"
_INT_NONNEG = "int>=0"
_FRACTION_OPEN = "fraction(0,1)"
_FRACTION_HALF_OPEN = "fraction(0,1]"
_POW2_OR_LIST = "pow2-or-list"
_POW2 = "pow2"
_BACKEND = "backend"
_ANY = "any"

#: Known PyTorch allocator options and the kind of value each takes.
TORCH_OPTIONS: dict[str, str] = {
    "backend": _BACKEND,
    "expandable_segments": _BOOL,
    "max_split_size_mb": _INT_GT20,
    "max_non_split_rounding_mb": _INT_GE20,
    "garbage_collection_threshold": _FRACTION_OPEN,
    "roundup_power2_divisions": _POW2_OR_LIST,
    "release_lock_on_cudamalloc": _BOOL,
    "pinned_use_cuda_host_register": _BOOL,
    "pinned_num_register_threads": _POW2,
    "pinned_use_background_threads": _BOOL,
    "pinned_reserve_segment_size_mb": _INT_NONNEG,
    "graph_capture_record_stream_reuse": _BOOL,
    "per_process_memory_fraction": _FRACTION_HALF_OPEN,
    "large_segment_size_mb": _INT_POS,
    "pinned_free_catch_all": _ANY,
    "throw_on_cudamalloc_oom": _ANY,
}

_NATIVE_ONLY = (
    "expandable_segments",
    "max_split_size_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
)

_JAX_ALLOCATORS = ("default", "platform", "bfc", "cuda_async", "vmm")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with allocator settings.

    Attributes:
        code: ``"unknown-option"``, ``"bad-value"``, ``"malformed"``, ``"duplicate-option"``,
            ``"conflict"``, ``"both-names-differ"``, ``"exported-twice"``,
            ``"unknown-variable"``.
        severity: ``"error"`` (the framework refuses it, or a setting is silently lost) or
            ``"warning"`` (accepted, but not what was meant).
        variable: The environment variable.
        option: The option inside it (``"max_split_size_mb"``), or ``None``.
        message: What is wrong.
        hint: What to write instead, or ``None``.
    """

    code: str
    severity: str
    variable: str
    option: str | None
    message: str
    hint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The problem as plain JSON data."""
        return plain_fields(self)


@dataclass(frozen=True)
class Setting:
    """One recommended environment variable.

    Attributes:
        variable: Its name.
        value: Its value.
        reason: Why, in one line.
        framework: ``"torch"`` or ``"jax"``.
    """

    variable: str
    value: str
    reason: str
    framework: str

    def to_dict(self) -> dict[str, Any]:
        """The setting as plain JSON data."""
        return plain_fields(self)


@dataclass(frozen=True)
class Recommendation:
    """Recommended settings for one use, with per-option reasons.

    Attributes:
        profile: ``"training"``, ``"inference"`` or ``"shared-gpu"``.
        settings: Environment variables to set.
        options: For the torch variable, each option with its reason.
        notes: Remarks (torch version handling, platform limits).
    """

    profile: str
    settings: tuple[Setting, ...]
    options: tuple[tuple[str, str, str], ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The recommendation as plain JSON data."""
        return {
            "profile": self.profile,
            "settings": [s.to_dict() for s in self.settings],
            "torch_options": [{"option": k, "value": v, "reason": r} for k, v, r in self.options],
            "notes": list(self.notes),
        }

    def environ(self) -> dict[str, str]:
        """The settings as a ``{variable: value}`` mapping."""
        return {s.variable: s.value for s in self.settings}


# -- PyTorch option strings ----------------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    # PyTorch's lexer: ',', ':', '[' and ']' are tokens of their own; spaces are dropped.
    tokens: list[str] = []
    buf: list[str] = []
    for ch in text:
        if ch in ",:[]":
            if buf:
                tokens.append("".join(buf))
                buf = []
            tokens.append(ch)
        elif ch != " ":
            buf.append(ch)
    if buf:
        tokens.append("".join(buf))
    return tokens


def parse_torch_conf(
    text: str, *, variable: str = "PYTORCH_ALLOC_CONF"
) -> tuple[list[tuple[str, str]], list[Problem]]:
    """Split a PyTorch allocator string into ``(option, value)`` pairs, in order.

    A list value (``roundup_power2_divisions:[256:1,>:4]``) is kept whole, brackets included.

    Returns:
        The pairs and the syntax problems (``"malformed"``) found on the way.

    >>> parse_torch_conf("expandable_segments:True, max_split_size_mb:128")[0]
    [('expandable_segments', 'True'), ('max_split_size_mb', '128')]
    """
    tokens = _tokens(text)
    pairs: list[tuple[str, str]] = []
    problems: list[Problem] = []
    i = 0
    hint = "write comma-separated key:value options, such as expandable_segments:True"
    while i < len(tokens):
        key = tokens[i]
        if key in ",:[]":
            if key != ",":
                problems.append(
                    Problem("malformed", "error", variable, None, f"unexpected {key!r}", hint)
                )
            i += 1
            continue
        if i + 1 >= len(tokens) or tokens[i + 1] != ":":
            problems.append(
                Problem(
                    "malformed",
                    "error",
                    variable,
                    key.split("=")[0] if "=" in key else key,
                    f"option {key!r} has no ':value'",
                    hint,
                )
            )
            i += 1
            while i < len(tokens) and tokens[i] != ",":
                i += 1
            continue
        i += 2
        if i >= len(tokens) or tokens[i] == ",":
            problems.append(
                Problem("malformed", "error", variable, key, f"option {key!r} has no value", hint)
            )
            continue
        if tokens[i] == "[":
            depth_end = i
            while depth_end < len(tokens) and tokens[depth_end] != "]":
                depth_end += 1
            if depth_end >= len(tokens):
                problems.append(
                    Problem("malformed", "error", variable, key, "list value lacks ']'", hint)
                )
                pairs.append((key, "".join(tokens[i:])))
                break
            pairs.append((key, "".join(tokens[i : depth_end + 1])))
            i = depth_end + 1
        else:
            pairs.append((key, tokens[i]))
            i += 1
        if i < len(tokens) and tokens[i] != ",":
            problems.append(
                Problem(
                    "malformed",
                    "error",
                    variable,
                    key,
                    f"expected ',' after {key}, found {tokens[i]!r}",
                    hint,
                )
            )
            while i < len(tokens) and tokens[i] != ",":
                i += 1
    return pairs, problems


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _as_int(text: str) -> int | None:
    return int(text) if re.fullmatch(r"[+]?\d+", text) else None


def _as_float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _check_value(variable: str, key: str, value: str) -> Problem | None:
    kind = TORCH_OPTIONS[key]

    def bad(message: str, hint: str) -> Problem:
        return Problem("bad-value", "error", variable, key, message, hint)

    if kind == _BOOL:
        if value not in ("True", "False"):
            return bad(
                f"{key} takes True or False (capitalised), not {value!r}",
                f"write {key}:{'True' if value.lower() in ('true', '1', 'yes') else 'False'}",
            )
    elif kind in (_INT_GT20, _INT_GE20, _INT_POS, _INT_NONNEG):
        n = _as_int(value)
        minimum = {_INT_GT20: 21, _INT_GE20: 20, _INT_POS: 1, _INT_NONNEG: 0}[kind]
        if n is None or n < minimum:
            rule = {
                _INT_GT20: "a whole number of MiB greater than 20",
                _INT_GE20: "a whole number of MiB of at least 20",
                _INT_POS: "a positive whole number",
                _INT_NONNEG: "a whole number >= 0",
            }[kind]
            return bad(f"{key} must be {rule}, not {value!r}", f"for instance {key}:512")
    elif kind in (_FRACTION_OPEN, _FRACTION_HALF_OPEN):
        x = _as_float(value)
        upper_ok = (x is not None) and (x < 1 if kind == _FRACTION_OPEN else x <= 1)
        if x is None or x <= 0 or not upper_ok:
            span = "(0, 1)" if kind == _FRACTION_OPEN else "(0, 1]"
            return bad(
                f"{key} must be a number in {span}, not {value!r}", f"for instance {key}:0.6"
            )
    elif kind == _POW2:
        n = _as_int(value)
        if n is None or not _is_pow2(n):
            return bad(f"{key} must be a power of two, not {value!r}", f"for instance {key}:8")
    elif kind == _BACKEND:
        if value not in ("native", "cudaMallocAsync"):
            return bad(
                f"backend must be native or cudaMallocAsync, not {value!r}",
                "write backend:native or backend:cudaMallocAsync",
            )
    elif kind == _POW2_OR_LIST:
        return _check_roundup(variable, key, value)
    return None


def _check_roundup(variable: str, key: str, value: str) -> Problem | None:
    hint = "write a power of two (roundup_power2_divisions:4) or [256:1,512:2,1024:4,>:8]"
    if not value.startswith("["):
        n = _as_int(value)
        if n is None or not _is_pow2(n):
            return Problem(
                "bad-value", "error", variable, key, f"{key} must be a power of two", hint
            )
        return None
    inner = value[1:-1] if value.endswith("]") else value[1:]
    for item in filter(None, inner.split(",")):
        size, _, divs = item.partition(":")
        d = _as_int(divs)
        if d is None or (d != 0 and not _is_pow2(d)):
            return Problem(
                "bad-value",
                "error",
                variable,
                key,
                f"{key}: divisions {divs!r} in {item!r} must be a power of two or 0",
                hint,
            )
        if size != ">":
            s = _as_int(size)
            if s is None or not _is_pow2(s):
                return Problem(
                    "bad-value",
                    "error",
                    variable,
                    key,
                    f"{key}: size {size!r} in {item!r} must be a power of two (MiB) or '>'",
                    hint,
                )
    return None


def check_torch_conf(text: str, *, variable: str = "PYTORCH_ALLOC_CONF") -> list[Problem]:
    """Validate one PyTorch allocator string.

    Finds syntax errors, unknown options (with the nearest known name), bad values,
    options given twice (the last wins) and options ``backend:cudaMallocAsync`` ignores.

    >>> [p.code for p in check_torch_conf("max_split_size_mb:20")]
    ['bad-value']
    >>> check_torch_conf("expandable_segments:True,garbage_collection_threshold:0.6")
    []
    """
    pairs, problems = parse_torch_conf(text, variable=variable)
    seen: dict[str, str] = {}
    for key, value in pairs:
        if key not in TORCH_OPTIONS:
            near = difflib.get_close_matches(key, list(TORCH_OPTIONS), n=1)
            problems.append(
                Problem(
                    "unknown-option",
                    "error",
                    variable,
                    key,
                    f"unknown allocator option {key!r} (PyTorch refuses it at the first CUDA "
                    "allocation)",
                    f"did you mean {near[0]}?" if near else "see `memfit env` for known options",
                )
            )
            continue
        if key in seen:
            problems.append(
                Problem(
                    "duplicate-option",
                    "warning",
                    variable,
                    key,
                    f"{key} is given twice ({seen[key]!r}, then {value!r}); the last wins",
                    f"keep one {key}",
                )
            )
        seen[key] = value
        problem = _check_value(variable, key, value)
        if problem is not None:
            problems.append(problem)
    if seen.get("backend") == "cudaMallocAsync":
        for key in _NATIVE_ONLY:
            if key in seen:
                problems.append(
                    Problem(
                        "conflict",
                        "warning",
                        variable,
                        key,
                        f"backend:cudaMallocAsync ignores {key} (a native-allocator option)",
                        f"drop {key}, or use backend:native",
                    )
                )
    return problems


# -- JAX variables ---------------------------------------------------------------------------------


def check_jax_env(env: Mapping[str, str]) -> list[Problem]:
    """Validate the JAX / XLA allocator variables in ``env``.

    >>> [p.code for p in check_jax_env({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"})]
    ['bad-value']
    >>> check_jax_env({"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    ...                "XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"})
    []
    """
    problems: list[Problem] = []
    pre = env.get("XLA_PYTHON_CLIENT_PREALLOCATE")
    if pre and pre not in ("true", "True", "1", "false", "False", "0"):
        problems.append(
            Problem(
                "bad-value",
                "warning",
                "XLA_PYTHON_CLIENT_PREALLOCATE",
                None,
                f"{pre!r} is read as true: only false, False or 0 turn preallocation off",
                "write XLA_PYTHON_CLIENT_PREALLOCATE=false or true",
            )
        )
    for var in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"):
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        x = _as_float(raw)
        if x is None or not 0 < x <= 1:
            problems.append(
                Problem(
                    "bad-value",
                    "error",
                    var,
                    None,
                    f"{var} must be a fraction in (0, 1], not {raw!r}",
                    f"for instance {var}=.75",
                )
            )
    if env.get("XLA_PYTHON_CLIENT_MEM_FRACTION") and env.get("XLA_CLIENT_MEM_FRACTION"):
        problems.append(
            Problem(
                "conflict",
                "error",
                "XLA_PYTHON_CLIENT_MEM_FRACTION",
                None,
                "XLA_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_MEM_FRACTION are both set: JAX "
                "refuses to start its GPU backend",
                "keep XLA_CLIENT_MEM_FRACTION and unset XLA_PYTHON_CLIENT_MEM_FRACTION",
            )
        )
    alloc_raw = env.get("XLA_PYTHON_CLIENT_ALLOCATOR")
    alloc = alloc_raw.lower() if alloc_raw else None
    if alloc is not None and alloc not in _JAX_ALLOCATORS:
        problems.append(
            Problem(
                "bad-value",
                "error",
                "XLA_PYTHON_CLIENT_ALLOCATOR",
                None,
                f"unknown allocator {alloc_raw!r}",
                "use one of " + ", ".join(_JAX_ALLOCATORS),
            )
        )
    if alloc == "platform":
        if pre is not None and pre not in ("false", "False", "0", ""):
            problems.append(
                Problem(
                    "conflict",
                    "warning",
                    "XLA_PYTHON_CLIENT_ALLOCATOR",
                    None,
                    "allocator=platform allocates exactly what is asked and never "
                    "preallocates: XLA_PYTHON_CLIENT_PREALLOCATE=true has no effect",
                    "unset XLA_PYTHON_CLIENT_PREALLOCATE, or use the default allocator",
                )
            )
        for var in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"):
            if env.get(var):
                problems.append(
                    Problem(
                        "conflict",
                        "warning",
                        var,
                        None,
                        f"allocator=platform has no pool, so {var} sets no limit",
                        "drop the fraction, or use the default allocator",
                    )
                )
    return problems


# -- whole environments and shell snippets -------------------------------------------------------


def check_environment(env: Mapping[str, str]) -> list[Problem]:
    """Validate every allocator variable in ``env`` (a process environment, as a mapping).

    Besides each variable on its own, reports both torch names set to different values:
    PyTorch 2.13's CUDA allocator reads ``PYTORCH_CUDA_ALLOC_CONF`` first while its generic
    allocator config reads ``PYTORCH_ALLOC_CONF`` first, so the two parts see different
    settings.

    >>> [p.code for p in check_environment({"PYTORCH_ALLOC_CONF": "expandable_segments:True",
    ...                                     "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})]
    ['both-names-differ']
    """
    problems: list[Problem] = []
    for var in TORCH_VARIABLES:
        value = env.get(var)
        if value:
            problems.extend(check_torch_conf(value, variable=var))
    new, old = env.get("PYTORCH_ALLOC_CONF"), env.get("PYTORCH_CUDA_ALLOC_CONF")
    if new and old and _normalized_conf(new) != _normalized_conf(old):
        problems.append(
            Problem(
                "both-names-differ",
                "error",
                "PYTORCH_CUDA_ALLOC_CONF",
                None,
                f"PYTORCH_ALLOC_CONF={new!r} and PYTORCH_CUDA_ALLOC_CONF={old!r} differ: "
                "parts of PyTorch read one, parts the other",
                "set both to the same value, or unset one",
            )
        )
    problems.extend(check_jax_env(env))
    return problems


def _normalized_conf(text: str) -> list[tuple[str, str]]:
    return parse_torch_conf(text)[0]


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


def check_shell(text: str, *, base_env: Mapping[str, str] | None = None) -> list[Problem]:
    """Validate the allocator variables a shell snippet sets, as the shell would end up.

    A variable assigned twice is reported (``"exported-twice"``): the second assignment
    silently replaces the first, so options only in the first are lost (an ``"error"`` when
    that loses options, a ``"warning"`` when the values are the same); an explicit ``unset``
    in between is deliberate and not reported. Then the final values
    (on top of ``base_env``, default empty) are checked with :func:`check_environment`.

    Raises:
        ConfigError: When a line cannot be split (an unclosed quote).
    """
    watched = set(TORCH_VARIABLES) | set(JAX_VARIABLES)
    env: dict[str, str] = dict(base_env or {})
    first: dict[str, tuple[int, str | None]] = {}
    problems: list[Problem] = []
    for lineno, name, value in parse_shell_assignments(text):
        if name in watched and name in first and value is not None and first[name][1] is not None:
            prev_line, prev_value = first[name]
            lost: list[str] = []
            if name in TORCH_VARIABLES and prev_value and value is not None:
                new_keys = {k for k, _ in parse_torch_conf(value)[0]}
                lost = [f"{k}:{v}" for k, v in parse_torch_conf(prev_value)[0] if k not in new_keys]
            same = prev_value == value
            detail = (
                f"; lost: {', '.join(lost)}"
                if lost
                else ("" if same else f"; {prev_value!r} is replaced by {value!r}")
            )
            problems.append(
                Problem(
                    "exported-twice",
                    "warning" if same else "error",
                    name,
                    None,
                    f"{name} is set on line {prev_line} and again on line {lineno}: the second "
                    f"silently replaces the first{detail}",
                    f"set {name} once, with every option comma-separated"
                    if name in TORCH_VARIABLES
                    else f"set {name} once",
                )
            )
        first[name] = (lineno, value)
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    problems.extend(check_environment(env))
    return problems


# -- recommendations ------------------------------------------------------------------------------

#: The two names of XLA's pool fraction: the one JAX now documents, and the older one (read
#: by every JAX; by newer ones as a deprecated name). Both are accepted; setting both stops
#: a newer JAX's GPU backend from starting.
JAX_FRACTION_VARIABLES: tuple[str, str] = (
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
)


def recommend(
    profile: str = "training",
    *,
    platform: str | None = None,
    torch_version: tuple[int, int] | None = None,
    gpu: GpuSpec | None = None,
    jax_fraction_variable: str = "XLA_PYTHON_CLIENT_MEM_FRACTION",
) -> Recommendation:
    """Recommended allocator settings for a use.

    Args:
        profile: ``"training"`` (one job owns the GPU), ``"inference"`` (changing request
            shapes) or ``"shared-gpu"`` (several processes on one GPU).
        platform: ``"linux"``, ``"win32"``, ...; default ``sys.platform``. On Windows,
            where PyTorch has no expandable segments, ``max_split_size_mb`` takes their
            place.
        torch_version: ``(major, minor)`` of the PyTorch in use, deciding which variable
            name(s) to set; ``None`` (unknown) sets both.
            :func:`memfit.runtime.allocator_env.recommend` reads the installed version.
        gpu: The GPU, for the XLA pool fraction of ``training``
            (:func:`memfit.allocator.xla_fraction.recommended_xla_fraction`); ``None``: any card of 8 GB
            or more.
        jax_fraction_variable: The name to set the XLA pool fraction under:
            ``XLA_CLIENT_MEM_FRACTION`` (the name JAX now documents) or
            ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (the older one, which every JAX reads; newer
            ones as a deprecated name). :func:`memfit.runtime.allocator_env.jax_fraction_name`
            says which the installed jaxlib reads.

    Raises:
        ConfigError: When the profile is unknown.

    >>> rec = recommend("shared-gpu", platform="linux", torch_version=(2, 13))
    >>> rec.environ()["XLA_PYTHON_CLIENT_PREALLOCATE"]
    'false'
    """
    if profile not in PROFILES:
        raise ConfigError(
            f"unknown profile {profile!r}",
            key_path="--for",
            hint="use one of " + ", ".join(PROFILES),
        )
    if jax_fraction_variable not in JAX_FRACTION_VARIABLES:
        raise ConfigError(
            f"not a JAX memory-fraction variable: {jax_fraction_variable!r}",
            key_path="jax_fraction_variable",
            hint="use " + " or ".join(JAX_FRACTION_VARIABLES),
        )
    plat = sys.platform if platform is None else platform
    version = torch_version
    windows = plat.startswith("win")
    options: list[tuple[str, str, str]] = []
    if windows:
        options.append(
            (
                "max_split_size_mb",
                "512",
                "expandable segments are not supported on Windows; not splitting blocks over "
                "512 MiB keeps large free blocks whole for large tensors",
            )
        )
    else:
        options.append(
            (
                "expandable_segments",
                "True",
                "grows one segment instead of many fixed ones: the fix PyTorch's own OOM "
                "message suggests for fragmentation",
            )
        )
    if profile == "inference":
        options.append(
            (
                "roundup_power2_divisions",
                "[256:1,512:2,1024:4,>:8]",
                "rounds changing request sizes to a few size classes so freed blocks fit the "
                "next request",
            )
        )
    if profile == "shared-gpu":
        options.append(
            (
                "garbage_collection_threshold",
                "0.6",
                "gives cached, unused blocks back once 60% of the allowed memory is in use, so "
                "neighbours can have them",
            )
        )
    conf = ",".join(f"{k}:{v}" for k, v, _r in options)
    notes: list[str] = []
    settings: list[Setting] = []
    torch_reason = "; ".join(f"{k}: {r}" for k, _v, r in options)
    if version is not None and version < (2, 8):
        names: tuple[str, ...] = ("PYTORCH_CUDA_ALLOC_CONF",)
        notes.append(f"torch {version[0]}.{version[1]} reads only PYTORCH_CUDA_ALLOC_CONF")
    else:
        names = TORCH_VARIABLES
        notes.append(
            "both torch names are set to the same value: torch >= 2.8 reads PYTORCH_ALLOC_CONF "
            "(and warns about the old name up to 2.11), but some versions ignore it for CUDA "
            "(pytorch/pytorch#183387); older ones read only PYTORCH_CUDA_ALLOC_CONF"
        )
    for name in names:
        settings.append(Setting(name, conf, torch_reason, "torch"))
    if profile == "training":
        advice = recommended_xla_fraction(gpu)
        settings.append(
            Setting(
                jax_fraction_variable,
                advice.value,
                advice.reason,
                "jax",
            )
        )
    elif profile == "inference":
        settings.append(
            Setting(
                "XLA_PYTHON_CLIENT_PREALLOCATE",
                "false",
                "allocate on demand, so the server holds what its requests need rather than "
                "75% of the GPU",
                "jax",
            )
        )
    else:
        settings.append(
            Setting(
                "XLA_PYTHON_CLIENT_PREALLOCATE",
                "false",
                "do not take 75% of a GPU other processes also use",
                "jax",
            )
        )
        settings.append(
            Setting(
                jax_fraction_variable,
                ".50",
                "cap this process at half the GPU (with preallocation off it is a limit, not "
                "a reservation)",
                "jax",
            )
        )
    notes.append(
        "set these before the framework starts on the GPU: in the shell, or with "
        "memfit.configure() before importing torch/jax code that touches CUDA"
    )
    return Recommendation(profile, tuple(settings), tuple(options), tuple(notes))


def render_shell(settings: Sequence[Setting] | Mapping[str, str], shell: str = "bash") -> str:
    """The settings as lines to paste into ``shell`` (``bash``, ``fish``, ``powershell``).

    Raises:
        ConfigError: When the shell is unknown.

    >>> print(render_shell({"A": "x:1,y:[2]"}, "fish"))
    set -gx A 'x:1,y:[2]'
    """
    if shell not in SHELLS:
        raise ConfigError(
            f"unknown shell {shell!r}", key_path="--shell", hint="use bash, fish or powershell"
        )
    pairs = (
        list(settings.items())
        if isinstance(settings, Mapping)
        else [(s.variable, s.value) for s in settings]
    )
    lines = []
    for name, value in pairs:
        if shell == "bash":
            lines.append(f"export {name}={shlex.quote(value)}")
        elif shell == "fish":
            lines.append(f"set -gx {name} {shlex.quote(value)}")
        else:
            escaped = value.replace("'", "''")
            lines.append(f"$env:{name} = '{escaped}'")
    return "\n".join(lines)


# -- the one reading of each framework's settings ------------------------------------------------


@dataclass(frozen=True)
class JaxAllocator:
    """What JAX's GPU client will do with its allocator variables.

    Attributes:
        preallocate: Whether the client reserves ``fraction`` of the GPU at its start.
        fraction: Fraction of the GPU's total memory the client may use (and preallocates).
        fraction_variable: The variable the fraction came from, or ``None`` (JAX's 0.75).
        allocator: ``"default"``, ``"platform"``, ``"bfc"``, ``"cuda_async"`` or ``"vmm"``.
    """

    preallocate: bool
    fraction: float
    fraction_variable: str | None
    allocator: str

    @property
    def platform_allocator(self) -> bool:
        """``XLA_PYTHON_CLIENT_ALLOCATOR=platform``: exact allocations, no pool."""
        return self.allocator == "platform"

    @property
    def pools(self) -> bool:
        """Whether the client reserves its pool up front (preallocation with a pooling
        allocator)."""
        return self.preallocate and not self.platform_allocator


#: JAX's default pool fraction (``jaxlib/xla_client.py``; shared REFERENCE.md).
_JAX_DEFAULT_FRACTION = 0.75


def read_jax_env(env: Mapping[str, str]) -> JaxAllocator:
    """Read JAX's allocator variables from ``env`` exactly as ``jaxlib`` does.

    ``XLA_PYTHON_CLIENT_PREALLOCATE`` turns preallocation off only for ``false``, ``False``
    or ``0`` (any other text leaves it on: :func:`check_jax_env` warns about such values);
    ``XLA_CLIENT_MEM_FRACTION`` is read before the deprecated
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``; the allocator name is read in lower case.

    Raises:
        ConfigError: Where JAX would refuse to start its GPU backend: both fraction variables
            set, a fraction that is not a number in (0, 1], or an unknown allocator.

    >>> read_jax_env({})
    JaxAllocator(preallocate=True, fraction=0.75, fraction_variable=None, allocator='default')
    >>> read_jax_env({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}).preallocate
    False
    """
    new = env.get("XLA_CLIENT_MEM_FRACTION", "")
    old = env.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "")
    if new and old:
        raise ConfigError(
            "XLA_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_MEM_FRACTION are both set: JAX "
            "refuses to start its GPU backend",
            key_path="XLA_PYTHON_CLIENT_MEM_FRACTION",
            hint="keep XLA_CLIENT_MEM_FRACTION and unset XLA_PYTHON_CLIENT_MEM_FRACTION",
        )
    fraction = _JAX_DEFAULT_FRACTION
    variable: str | None = None
    if new or old:
        variable = "XLA_CLIENT_MEM_FRACTION" if new else "XLA_PYTHON_CLIENT_MEM_FRACTION"
        raw = new or old
        value = _as_float(raw)
        if value is None or not 0 < value <= 1:
            raise ConfigError(
                f"{variable} must be a fraction in (0, 1], not {raw!r}",
                key_path=variable,
                hint=f"for instance {variable}=.75",
            )
        fraction = value
    allocator = env.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower() or "default"
    if allocator not in _JAX_ALLOCATORS:
        raise ConfigError(
            f"unknown allocator {env.get('XLA_PYTHON_CLIENT_ALLOCATOR')!r}",
            key_path="XLA_PYTHON_CLIENT_ALLOCATOR",
            hint="use one of " + ", ".join(_JAX_ALLOCATORS),
        )
    preallocate_text = env.get("XLA_PYTHON_CLIENT_PREALLOCATE", "")
    preallocate = not preallocate_text or preallocate_text not in ("false", "False", "0")
    return JaxAllocator(preallocate, fraction, variable, allocator)


def torch_allocator_options(text: str | None, variable: str) -> tuple[bool, int | None]:
    """``(expandable_segments, max_split_size in bytes)`` from a PyTorch allocator string:
    the two options the allocator replay (:mod:`memfit.estimate.torch_trace`) models.

    Raises:
        ConfigError: When the string is malformed or one of the two values is not what
            PyTorch accepts (the range of ``max_split_size_mb`` is the replay's to check).

    >>> torch_allocator_options("expandable_segments:True,max_split_size_mb:128", "X")
    (True, 134217728)
    >>> torch_allocator_options(None, "X")
    (False, None)
    """
    if not text:
        return False, None
    pairs, problems = parse_torch_conf(text, variable=variable)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ConfigError(errors[0].message, key_path=variable, hint=errors[0].hint)
    expandable = False
    max_split: int | None = None
    for key, value in pairs:
        if key == "expandable_segments":
            problem = _check_value(variable, key, value)
            if problem is not None:
                raise ConfigError(problem.message, key_path=variable, hint=problem.hint)
            expandable = value == "True"
        elif key == "max_split_size_mb":
            if not re.fullmatch(r"[0-9]{1,12}", value):  # isdigit() also takes '²'
                raise ConfigError(
                    f"max_split_size_mb must be a whole number of MiB, not {value!r}",
                    key_path=variable,
                    hint="write e.g. max_split_size_mb:128",
                )
            max_split = int(value) * 1024 * 1024
    return expandable, max_split


def workload_settings(
    framework: str,
    *,
    jax_preallocate: bool = True,
    pool_fraction: float | None = None,
    gpu: GpuSpec | None = None,
    platform: str | None = None,
    torch_version: tuple[int, int] | None = None,
) -> dict[str, str]:
    """The allocator settings a planned job runs with (``memfit plan``'s last lines,
    ``--write``'s ``environment``, ``Plan.environment``).

    JAX: preallocation and the pool's fraction exactly as the plan modelled them (the plan
    checks the job against that pool); ``pool_fraction=None`` gives memfit's recommendation
    for ``gpu``. PyTorch: the torch part of :func:`recommend` for training (expandable
    segments; the plan's allocator slack assumes classic segments, so with expandable
    segments the job holds at most what the plan predicts). On the host (``gpu.arch ==
    "cpu"``) there is no device allocator to configure.

    >>> workload_settings("jax", pool_fraction=0.9)
    {'XLA_PYTHON_CLIENT_PREALLOCATE': 'true', 'XLA_PYTHON_CLIENT_MEM_FRACTION': '0.90'}
    >>> workload_settings("jax", jax_preallocate=False)
    {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}
    """
    if gpu is not None and gpu.arch == "cpu":
        return {}
    if framework == "jax":
        if not jax_preallocate:
            return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        fraction = (
            pool_fraction if pool_fraction is not None else (recommended_xla_fraction(gpu).fraction)
        )
        return {
            "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{fraction:.2f}",
        }
    rec = recommend("training", platform=platform, torch_version=torch_version)
    return {s.variable: s.value for s in rec.settings if s.framework == "torch"}
