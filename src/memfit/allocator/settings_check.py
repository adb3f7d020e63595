"""Allocator settings checked: PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF``
options, JAX's ``XLA_PYTHON_CLIENT_*`` variables, a process environment and a shell script.

Every problem is a :class:`Problem` with a code that names the variable and the option; the
option table follows PyTorch's ``c10/cuda/CUDAAllocatorConfig.h`` (2.13) and JAX's
``jaxlib/xla_client.py`` (0.10), as :mod:`memfit.allocator.settings` describes.

>>> [p.code for p in check_torch_conf("expandable_segments:true")]
['bad-value']
>>> [p.code for p in check_shell('''export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
... export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128''')]
['exported-twice']
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memfit._checks import parse_int
from memfit._plain import plain_fields
from memfit.allocator.shell import parse_shell_assignments
from memfit.errors import ConfigError

#: The two names PyTorch reads its allocator options from.
TORCH_VARIABLES: tuple[str, str] = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


#: The JAX / XLA variables checked here.
JAX_VARIABLES: tuple[str, ...] = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)


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


JAX_ALLOCATORS = ("default", "platform", "bfc", "cuda_async", "vmm")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with allocator settings.

    Attributes:
        code: ``"unknown-option"``, ``"bad-value"``, ``"malformed"``, ``"duplicate-option"``,
            ``"conflict"``, ``"both-names-differ"``, ``"exported-twice"``,
            ``"unknown-variable"``, ``"over-rule"`` (an XLA pool over memfit's rule for the
            card).
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
    """The integer a value is (the one parser of integers from users), else ``None``."""
    if text.strip()[:1] == "-":
        return None
    try:
        return parse_int("value", text, lo=0)
    except ConfigError:
        return None


def as_float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def check_value(variable: str, key: str, value: str) -> Problem | None:
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
        x = as_float(value)
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
        problem = check_value(variable, key, value)
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
        x = as_float(raw)
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
    if alloc is not None and alloc not in JAX_ALLOCATORS:
        problems.append(
            Problem(
                "bad-value",
                "error",
                "XLA_PYTHON_CLIENT_ALLOCATOR",
                None,
                f"unknown allocator {alloc_raw!r}",
                "use one of " + ", ".join(JAX_ALLOCATORS),
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


def check_jax_fraction(env: Mapping[str, str], gpu: Any = None) -> list[Problem]:
    """A preallocated XLA pool larger than memfit's rule for ``gpu`` (a
    :class:`memfit.hardware.catalog.GpuSpec`): the same rule ``memfit plan`` and ``memfit
    env`` use (:func:`memfit.allocator.xla_fraction.recommended_xla_fraction`), so the
    check cannot pass a fraction the plan would not. Nothing to say without a card, with
    preallocation off, or with the platform allocator (no pool).

    >>> from memfit.hardware.catalog import gpu
    >>> [p.code for p in check_jax_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.99"},
    ...                                     gpu("RTX 3070 Laptop"))]
    ['over-rule']
    """
    from memfit.allocator.xla_fraction import recommended_xla_fraction

    if gpu is None or getattr(gpu, "arch", None) == "cpu":
        return []
    if env.get("XLA_PYTHON_CLIENT_PREALLOCATE") in ("false", "False", "0"):
        return []
    if (env.get("XLA_PYTHON_CLIENT_ALLOCATOR") or "").lower() == "platform":
        return []
    advice = recommended_xla_fraction(gpu)
    problems: list[Problem] = []
    for var in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"):
        x = as_float(env.get(var) or "")
        if x is None or not 0 < x <= 1 or x <= advice.fraction + 1e-9:
            continue
        problems.append(
            Problem(
                "over-rule",
                "warning",
                var,
                None,
                f"{var}={env[var]} preallocates more of the {gpu.name} than memfit's rule "
                f"for it ({advice.value}: {advice.reason})",
                f"{var}={advice.value}, as memfit plan and memfit env --gpu give",
            )
        )
    return problems


def check_shell(
    text: str, *, base_env: Mapping[str, str] | None = None, gpu: Any = None
) -> list[Problem]:
    """Validate the allocator variables a shell snippet sets, as the shell would end up.

    A variable assigned twice is reported (``"exported-twice"``): the second assignment
    silently replaces the first, so options only in the first are lost (an ``"error"`` when
    that loses options, a ``"warning"`` when the values are the same); an explicit ``unset``
    in between is deliberate and not reported. Then the final values
    (on top of ``base_env``, default empty) are checked with :func:`check_environment`,
    and an XLA pool fraction against memfit's rule for ``gpu`` (:func:`check_jax_fraction`).

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
    problems.extend(check_jax_fraction(env, gpu))
    return problems
