"""Choose cuBLAS for GEMM fusions in a deviceless XLA:GPU compile, through XLA's autotune cache.

Without a device, XLA's autotuner gives every Triton GEMM fusion its default Triton tiling
(``use_default_config``, ``xla/service/gpu/autotuning/autotuner_pass.cc``). On a device it may
pick cuBLASLt instead (``CUBLASLT_FISSION``): the fusion is then inlined as a cuBLASLt call and
whatever it fused (a bias add, a ``tanh``, an update's ``subtract``) becomes a kernel and a
buffer of its own (``xla/backends/gpu/autotuner/fission_backend.cc``, ``ApplyConfig``). That
is the same rewrite a device makes, and the compiler performs it without a device when the
choice comes from its cache: ``ConfigAssigner::GetConfig`` looks the instruction up before it
falls back to the default (``xla/backends/autotuner/config_assigner.cc``), and the per-fusion
cache directory (``xla_gpu_per_fusion_autotune_cache_dir``) is read on every lookup, one
``AutotuneResult`` text proto per fusion (``xla/service/gpu/autotuning/autotuner_cache.cc``).
An entry ``gemm { algorithm: 0 autotune_workspace_size: N }`` becomes ``CUBLASLT_FISSION`` for
a fusion (``xla/backends/gpu/autotuner/legacy_cache.cc``, ``GetConfig``) with an ``N``-byte
workspace: the device's autotuner keeps the rewriter's whole workspace (32 MiB from Hopper on).

The cache files are named by XLA's key (:func:`cache_file_name`), which holds the fusion's
canonical HLO; XLA logs the name it looked for when ``TF_CPP_VMODULE`` turns on
:data:`LOG_ENV`. So a deviceless compile runs twice: once with an empty cache folder (the
Triton defaults, and the log of every lookup, :func:`parse_lookups`), then with the chosen
fusions' entries written (:func:`write_cublas_choices`). Checked with jaxlib 0.10.2 (XLA
5a9e73c): the all-cuBLAS compile of an MLP step for an H100 gives, byte for byte, the
temporaries an H100 measured with jaxlib 0.11.2 (``bench/xla_floor_probe.py`` rows).

Two of XLA's own routes do not work without a device: ``xla_gpu_dump_autotune_results_to``
is written only when the compile has a stream executor (``gpu_compiler.cc``), and default
configs are never entered in the cache; ``xla_gpu_load_autotune_results_from`` is read once
per process (``absl::call_once``). A result XLA read from a cache file stays in its in-process
cache for the rest of the process, so compile every Triton-default variant of a process before
any compile with cuBLAS choices.

Standard library only: the compile's child process uses it next to JAX.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "KEY_LOG_ENV",
    "LOG_ENV",
    "CacheLookup",
    "ResultEntry",
    "cache_file_name",
    "cache_options",
    "captured_stderr",
    "compile_with_cublas",
    "cublas_result",
    "parse_key",
    "parse_lookups",
    "parse_results",
    "write_cublas_choices",
    "write_replayed",
]

#: Environment that makes XLA log each autotune-cache lookup (set before JAX is imported):
#: ``config_assigner.cc`` logs the instruction, ``autotuner_cache.cc`` the file it looked for.
LOG_ENV: Mapping[str, str] = {
    "TF_CPP_VMODULE": "autotuner_cache=1,config_assigner=1",
    "TF_CPP_MIN_LOG_LEVEL": "0",
}

#: :data:`LOG_ENV` with each missed key in full (``autotuner_cache.cc`` at level 2), for
#: :func:`parse_key`.
KEY_LOG_ENV: Mapping[str, str] = {
    **LOG_ENV,
    "TF_CPP_VMODULE": "autotuner_cache=2,config_assigner=1",
}

_GETTING = re.compile(r"Getting config for HLO: %(\S+) = (.*)$")
_NOT_FOUND = re.compile(r"Autotune result file not found: (\S+)$")
_SHAPE = re.compile(r"\b(pred|[suf](?:8|16|32|64)|bf16|c64|c128)\[([0-9,]*)\]")
_BYTES = {"pred": 1, "c64": 8, "c128": 16, "bf16": 2}


@dataclass(frozen=True)
class CacheLookup:
    """One autotune-cache lookup that XLA logged.

    Attributes:
        name: The instruction's name (``gemm_fusion_dot.3``).
        instruction: The instruction as XLA printed it (result shape, operands, backend
            config); the first of its equivalent instructions, which share one entry.
        file_name: The cache file XLA looked for (``<key hash>.textproto``).
    """

    name: str
    instruction: str
    file_name: str

    @property
    def triton_gemm(self) -> bool:
        """Whether it is a Triton GEMM fusion, the kind a device may hand to cuBLAS."""
        return '"kind":"__triton_gemm"' in self.instruction

    @property
    def result_bytes(self) -> int:
        """Bytes of the instruction's result (its shapes before ``fusion(``)."""
        head = self.instruction.split(" fusion(", 1)[0]
        total = 0
        for dtype, dims in _SHAPE.findall(head):
            count = 1
            for dim in dims.split(","):
                if dim:
                    count *= int(dim)
            width = _BYTES.get(dtype) or int(dtype[1:]) // 8
            total += count * width
        return total


def cache_options(folder: str | os.PathLike[str]) -> dict[str, str]:
    """Compiler options that make XLA read (never write) the per-fusion cache in ``folder``."""
    return {
        "xla_gpu_per_fusion_autotune_cache_dir": os.fspath(folder),
        "xla_gpu_experimental_autotune_cache_mode": "AUTOTUNE_CACHE_MODE_READ",
    }


def parse_lookups(log: str) -> list[CacheLookup]:
    """The cache lookups that missed, in the log of a compile run with :data:`LOG_ENV`.

    XLA looks each group of equivalent instructions up once, on one thread, so each
    "Getting config" line is followed by its own "file not found" line.

    >>> parse_lookups(
    ...     "I1 config_assigner.cc:285] Getting config for HLO: %gemm_fusion_dot.1 = "
    ...     'f32[8,8]{1,0} fusion(%a, %b), kind=kCustom, backend_config={"kind":"__triton_gemm"}\\n'
    ...     "I1 autotuner_cache.cc:173] Autotune result file not found: /c/Ab-_9.textproto\\n"
    ... )[0].file_name
    'Ab-_9.textproto'
    """
    found: list[CacheLookup] = []
    current: tuple[str, str] | None = None
    for line in log.splitlines():
        getting = _GETTING.search(line)
        if getting is not None:
            current = (getting.group(1), getting.group(2))
            continue
        missed = _NOT_FOUND.search(line)
        if missed is not None and current is not None:
            found.append(CacheLookup(current[0], current[1], Path(missed.group(1)).name))
            current = None
    return found


def cublas_result(workspace_bytes: int, algorithm: int = 0) -> str:
    """The ``AutotuneResult`` text proto of a cuBLASLt choice (``xla/autotuning.proto``,
    ``GemmKey``): for a fusion it reads as ``CUBLASLT_FISSION``, and the call's workspace
    becomes ``workspace_bytes``.

    >>> print(cublas_result(4 << 20), end="")
    gemm {
      algorithm: 0
      autotune_workspace_size: 4194304
    }
    """
    return f"gemm {{\n  algorithm: {algorithm}\n  autotune_workspace_size: {workspace_bytes}\n}}\n"


def write_cublas_choices(
    lookups: Iterable[CacheLookup],
    folder: str | os.PathLike[str],
    *,
    workspace_bytes: int,
    select: Callable[[CacheLookup], bool] | None = None,
) -> list[CacheLookup]:
    """Write a cuBLAS entry into ``folder`` for each Triton GEMM fusion that ``select``
    accepts (every one when ``None``); returns those written."""
    written = []
    for lookup in lookups:
        if not lookup.triton_gemm or (select is not None and not select(lookup)):
            continue
        (Path(folder) / lookup.file_name).write_text(
            cublas_result(workspace_bytes), encoding="utf-8"
        )
        written.append(lookup)
    return written


def cache_file_name(model: str, hlo: str, version: int) -> str:
    """The per-fusion cache file XLA reads for a key: the URL-safe base64 (no padding) of the
    SHA-256 of ``<key model='...', hlo='...', version=N>`` (``AutotuneCacheKey::ToString``,
    ``GetBase64EncodedSha256Hash``). With it, the entries of a device's
    ``xla_gpu_dump_autotune_results_to`` file (``device``, ``hlo``, ``version``, ``result``)
    can be written for a deviceless compile, whose ``model`` string differs (its ``DNN
    version`` is ``0.0.0``).

    >>> cache_file_name("CUDA: 9.0", "{}", 45)
    'V7NKCAgGgX88QZdtjroihZIZ_GSE5ZZU9I_487PB74k.textproto'
    """
    key = f"<key model='{model}', hlo='{hlo}', version={version}>"
    digest = hashlib.sha256(key.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=") + ".textproto"


@contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Capture file descriptor 2 (where XLA logs) for the block; the text is in the list when
    the block ends, and is written on to the real descriptor 2 as well."""
    captured: list[str] = []
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            data = sink.read()
            os.write(2, data)
            captured.append(data.decode(errors="replace"))


def compile_with_cublas(
    lowered: Any,
    *,
    workspace_bytes: int,
    select: Callable[[CacheLookup], bool] | None = None,
    options: Mapping[str, Any] | None = None,
) -> tuple[Any, Any, list[CacheLookup]]:
    """Compile ``lowered`` (a ``jax.stages.Lowered``) twice: with XLA's default configs, then
    with cuBLAS chosen for the selected Triton GEMM fusions. The process must run with
    :data:`LOG_ENV` (set before JAX is imported).

    Returns:
        The default compile, the cuBLAS compile (``None`` when no fusion was chosen), and the
        fusions chosen.
    """
    base = dict(options or {})
    with tempfile.TemporaryDirectory(prefix="memfit-autotune-") as folder:
        # two folders: JAX reuses an executable compiled with the same options
        empty, choices = Path(folder) / "empty", Path(folder) / "cublas"
        empty.mkdir()
        choices.mkdir()
        with captured_stderr() as log:
            default = lowered.compile(compiler_options={**base, **cache_options(empty)})
        chosen = write_cublas_choices(
            parse_lookups("".join(log)), choices, workspace_bytes=workspace_bytes, select=select
        )
        if not chosen:
            return default, None, []
        cublas = lowered.compile(compiler_options={**base, **cache_options(choices)})
    return default, cublas, chosen


def parse_key(log: str) -> tuple[str, int] | None:
    """The device string and version of the compile's cache keys (``<key model='...', hlo=
    '...', version=N>``), from a log written under :data:`KEY_LOG_ENV`; ``None`` when it
    has no key."""
    match = re.search(r"key = <key model='(.*?)', hlo='.*?', version=(\d+)>", log, re.S)
    return None if match is None else (match.group(1), int(match.group(2)))


@dataclass(frozen=True)
class ResultEntry:
    """One entry of an ``AutotuneResults`` text proto (``xla/autotune_results.proto``), as
    ``xla_gpu_dump_autotune_results_to`` writes it on a device.

    Attributes:
        device: The device string of its key.
        hlo: The fusion's (or custom call's) canonical HLO.
        version: The key's version.
        result: The ``AutotuneResult`` text proto, without the ``result { }`` around it.
    """

    device: str
    hlo: str
    version: int
    result: str

    @property
    def backend(self) -> str:
        """What the autotuner chose: ``"cublas"`` (a ``gemm`` result), ``"triton"``,
        ``"cudnn"`` (an ``algorithm``), or the ``other`` result's backend name."""
        fields = dict(_fields(self.result))
        if "gemm" in fields:
            return "cublas"
        if "triton" in fields:
            return "triton"
        if "algorithm" in fields:
            return "cudnn"
        name = dict(_fields(fields.get("other", ""))).get("name", "")
        return _unquote(name) if name.startswith('"') else "unknown"


def _fields(body: str) -> list[tuple[str, str]]:
    """The top-level ``(name, value)`` pairs of a text proto body: a value is a quoted
    string (still quoted), a scalar, or a message's body (without its braces)."""
    found: list[tuple[str, str]] = []
    index, size = 0, len(body)
    while index < size:
        char = body[index]
        if char.isspace():
            index += 1
        elif char == "#":
            end = body.find("\n", index)
            index = size if end < 0 else end
        else:
            match = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*:?\s*").match(body, index)
            if match is None:
                raise ValueError(f"unexpected text at {index}: {body[index : index + 30]!r}")
            name, index = match.group(1), match.end()
            if body.startswith("{", index):
                start, depth, quote = index + 1, 0, ""
                while index < size:
                    char = body[index]
                    if quote:
                        if char == "\\":
                            index += 1
                        elif char == quote:
                            quote = ""
                    elif char in "\"'":
                        quote = char
                    elif char == "{":
                        depth += 1
                    elif char == "}":
                        depth -= 1
                        if depth == 0:
                            break
                    index += 1
                found.append((name, body[start:index]))
                index += 1
            elif body.startswith(('"', "'"), index):
                quote, start = body[index], index
                index += 1
                while index < size and body[index] != quote:
                    index += 2 if body[index] == "\\" else 1
                index += 1
                found.append((name, body[start:index]))
            else:
                token = re.compile(r"[^\s{}#]+").match(body, index)
                if token is None:
                    raise ValueError(f"no value for {name!r} at {index}")
                found.append((name, token.group(0)))
                index = token.end()
    return found


def _unquote(value: str) -> str:
    """A text proto string's text (C escapes, octal UTF-8 bytes)."""
    raw = value[1:-1].encode("latin-1", errors="backslashreplace")
    unescaped: bytes = codecs.escape_decode(raw)[0]
    return unescaped.decode("utf-8", errors="replace")


def parse_results(text: str) -> list[ResultEntry]:
    """The entries of an ``AutotuneResults`` text proto.

    Raises:
        ValueError: When the text is not one.
    """
    entries = []
    for name, body in _fields(text):
        if name != "results":
            continue
        fields = _fields(body)
        values = {key: value for key, value in fields}
        if "hlo" not in values or "result" not in values:
            raise ValueError("an AutotuneResults entry without hlo or result")
        entries.append(
            ResultEntry(
                device=_unquote(values.get("device", '""')),
                hlo=_unquote(values["hlo"]),
                version=int(values.get("version", "0")),
                result=values["result"].strip(),
            )
        )
    return entries


def write_replayed(
    entries: Iterable[ResultEntry], folder: str | os.PathLike[str], *, key: tuple[str, int]
) -> int:
    """Write a device's choices as the per-fusion cache files that a deviceless compile reads
    (``key``: its keys' device string and version, :func:`parse_key`); returns how many.
    An entry of version 0 (an older dump) takes the compile's version, as XLA does."""
    model, version = key
    written = 0
    for entry in entries:
        name = cache_file_name(model, entry.hlo, entry.version or version)
        (Path(folder) / name).write_text(entry.result + "\n", encoding="utf-8")
        written += 1
    return written
