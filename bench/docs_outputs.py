"""Every command output shown in README.md and docs/*.md, produced from the code.

    python bench/docs_outputs.py --write            # regenerate every shown output in place
    python bench/docs_outputs.py --check            # exit 1, with a diff, where one is stale
    python bench/docs_outputs.py --check --only fast        # without the examples' runs
    python bench/docs_outputs.py --write --only examples    # only the examples' runs

A shown output is the fenced block right after a marker line::

    <!-- memfit-output: NAME -->
    ```console
    $ memfit plan ...
    ...
    ```

and a figure quoted in prose is ``<!-- memfit-value: NAME -->490,000<!-- /memfit-value -->``.
``NAME`` is a key of :data:`BLOCKS` or :data:`VALUES`. Each block's commands are run as
written (``memfit ...`` in this process, through the CLI's own ``main``; a small shell runs
``&&``, ``|`` into ``head`` / ``grep``, ``>`` and ``2>&1`` and ``echo $?``), in a fresh
temporary folder, with no measurement cache (``MEMFIT_CACHE_DIR``) and, where a command does
not name the host's RAM, 32 GiB of it (``memfit.planning.host_memory`` is replaced: the
shown outputs do not depend on the machine that made them). The examples' runs
(``python examples/.../run.py``) take minutes and print timings: they are regenerated with
``--only examples`` and checked by ``pytest -m examples`` (tests/examples/test_examples.py),
timings and temporary paths left out of the comparison (:func:`normalise`).

``tests/test_docs_outputs.py`` runs ``--check --only fast`` in CI; when a change of the code
changes a shown output, it fails and says to run ``python bench/docs_outputs.py --write``.
``docs/benchmarks.md`` is not generated here: its figures are measurements, each with its
date, machine and command.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REGENERATE = "python bench/docs_outputs.py --write"

#: The host RAM the shown outputs assume where a command does not name it (total, free).
HOST_RAM = (32 * 2**30, 32 * 2**30)

_OUTPUT = re.compile(r"<!-- memfit-output: ([\w.-]+) -->\n(```[a-z]*\n)(.*?)(```)", re.S)
_VALUE = re.compile(r"<!-- memfit-value: ([\w.-]+) -->(.*?)<!-- /memfit-value -->", re.S)


# --- running a shown command -------------------------------------------------------------------


class _Terminal:
    """What a terminal shows, in order, and each stream on its own."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, str]] = []

    def stream(self, name: str) -> io.TextIOBase:
        terminal = self

        class _Stream(io.TextIOBase):
            def write(self, text: str) -> int:
                terminal.chunks.append((name, text))
                return len(text)

            def isatty(self) -> bool:
                return False

        return _Stream()

    def text(self, *names: str) -> str:
        return "".join(t for n, t in self.chunks if n in names)


def _memfit(argv: list[str]) -> tuple[int, _Terminal]:
    from memfit.cli.main import main

    term = _Terminal()
    with (
        contextlib.redirect_stdout(term.stream("out")),
        contextlib.redirect_stderr(term.stream("err")),
    ):
        code = main(argv)
    return code, term


def _python(argv: list[str]) -> tuple[int, _Terminal]:
    """``python SCRIPT ARGS`` in this process (the scripts the fast blocks run are short)."""
    term = _Terminal()
    script = ROOT / argv[0]
    old_argv = sys.argv
    sys.argv = [str(script), *argv[1:]]
    code = 0
    try:
        with (
            contextlib.redirect_stdout(term.stream("out")),
            contextlib.redirect_stderr(term.stream("err")),
        ):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old_argv
    return code, term


def _filter(stage: list[str], text: str) -> str:
    """``head -N`` or ``grep [-A N] PATTERN``: the shell stages the docs use."""
    lines = text.splitlines(keepends=True)
    if stage[0] == "head":
        count = int(stage[1].lstrip("-n")) if len(stage) > 1 else 10
        return "".join(lines[:count])
    if stage[0] == "grep":
        after = 0
        for i, word in enumerate(stage[1:-1], 1):
            if word == "-A":
                after = int(stage[i + 1])
            elif word.startswith("-A"):
                after = int(word[2:])
        pattern = stage[-1]
        keep: set[int] = set()
        for i, line in enumerate(lines):
            if pattern in line:
                keep.update(range(i, min(len(lines), i + after + 1)))
        return "".join(lines[i] for i in sorted(keep))
    raise ValueError(f"the docs' shell runs head and grep after a pipe, not {stage[0]}")


def run_shell(line: str, cwd: Path, state: dict[str, int] | None = None) -> str:
    """What a terminal shows for one shown command line (see the module's docstring);
    ``state`` carries the last exit status from one line to the next (``echo $?``)."""
    state = {} if state is None else state
    tokens = shlex.split(line, comments=True)
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token == "&&":
            segments.append([])
        else:
            segments[-1].append(token)
    shown: list[str] = []
    code = state.get("code", 0)
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        for words in segments:
            if words == ["echo", "$?"]:
                shown.append(f"{code}\n")
                continue
            stages: list[list[str]] = [[]]
            for word in words:
                if word == "|":
                    stages.append([])
                else:
                    stages[-1].append(word)
            first, rest = stages[0], stages[1:]
            merged = "2>&1" in first
            target = first[first.index(">") + 1] if ">" in first else None
            argv = [
                w
                for i, w in enumerate(first)
                if w != "2>&1" and ">" not in (w, first[i - 1] if i else "")
            ]
            if argv[0] == "memfit":
                code, term = _memfit(argv[1:])
            elif argv[0] == "python":
                code, term = _python(argv[1:])
            elif argv[0] == "head":
                code, term = 0, _Terminal()
                term.chunks.append(("out", _filter(argv, (cwd / argv[-1]).read_text())))
            else:
                raise ValueError(f"the docs' shell does not run {argv[0]}")
            stream = term.text("out", "err") if merged else term.text("out")
            for stage in rest:
                stream = _filter(stage, stream)
            if target is not None:
                if target != "/dev/null":
                    (cwd / target).write_text(stream)
                stream = ""
            if merged:
                shown.append(stream)
            else:
                # a terminal shows stderr as it comes, and stdout where it is not redirected
                out_text = stream if (rest or target is not None) else None
                for name, text in term.chunks:
                    if name == "err" or out_text is None:
                        shown.append(text)
                if out_text:
                    shown.append(out_text)
            if code != 0:
                break
    finally:
        os.chdir(previous)
        state["code"] = code
    # a terminal does not show trailing blanks (Rich pads a table's title to its width)
    return "".join(line.rstrip() + "\n" for line in "".join(shown).splitlines())


# --- the blocks ---------------------------------------------------------------------------------


def _buffer_size(out: str) -> str:
    match = re.search(r"│ buffer_size\s*│\s*(\d+)\s*│", out)
    return f"{int(match.group(1)):,}" if match else "?"


def _head(lines: list[str]) -> int:
    """How many lines the plan's summary takes: those before its table of terms."""
    return next((i for i, x in enumerate(lines) if x.startswith("Predicted peak")), 3)


def _first(*patterns: str) -> Callable[[str], str]:
    """The plan's summary, ``...``, then the lines that match a pattern (in order)."""

    def keep(text: str) -> str:
        lines = text.splitlines()
        head = _head(lines)
        rest = [x for x in lines[head:] if any(re.search(p, x) for p in patterns)]
        return "\n".join([*lines[:head], "...", *rest]) + "\n"

    return keep


def _from(start: str) -> Callable[[str], str]:
    """The plan's summary, ``...``, then everything from the first line with ``start``."""

    def keep(text: str) -> str:
        lines = text.splitlines()
        at = next(i for i, x in enumerate(lines) if start in x)
        return "\n".join([*lines[: _head(lines)], "...", *lines[at:]]) + "\n"

    return keep


@dataclass(frozen=True)
class Run:
    """One shown command: the line after ``$`` (``{}`` takes :attr:`comment`'s text), the
    line actually run (by default the shown one), and what of its output is shown."""

    shown: str
    keep: Callable[[str], str] | None = None
    comment: Callable[[str], str] | None = None
    run: str | None = None

    def render(self, cwd: Path, state: dict[str, int]) -> str:
        command = self.run or self.shown.replace("{}", "").replace("\\\n    ", "")
        output = run_shell(command, cwd, state)
        kept = self.keep(output) if self.keep is not None else output
        shown = self.shown.replace("{}", self.comment(output) if self.comment else "")
        return f"$ {shown}\n{kept}"


@dataclass(frozen=True)
class Block:
    """A shown output: its commands in order, in one temporary folder; ``examples``: run as
    a subprocess, checked by ``pytest -m examples`` (:func:`normalise`)."""

    runs: tuple[Run, ...]
    examples: bool = False
    env: dict[str, str] = field(default_factory=dict)
    #: Lines left out of an example's output (other libraries' own logging), as regexes.
    drop: tuple[str, ...] = ()


def _until(pattern: str) -> Callable[[str], str]:
    """Everything before the first line that matches ``pattern``, then ``...``."""

    def keep(text: str) -> str:
        lines = text.splitlines()
        end = next((i for i, x in enumerate(lines) if re.search(pattern, x)), len(lines))
        return "\n".join([*lines[:end], "..."]) + "\n"

    return keep


def _plan(shown: str, **kw: Any) -> Block:
    return Block((Run(shown, **kw),))


BLOCKS: dict[str, Block] = {
    "readme-explain": Block(
        (
            Run("python examples/oom_rehearsal.py"),
            Run("memfit explain oom_rehearsal.oom1.snapshot.pickle"),
        )
    ),
    "readme-plan-brax": _plan(
        'memfit plan brax_humanoid_ppo --gpu "RTX 4070"', keep=_until("^Chosen knobs")
    ),
    "guide-plan-brax": _plan('memfit plan brax_humanoid_ppo --gpu "RTX 4070"'),
    "guide-plan-brax-pinned": _plan(
        'memfit plan brax_humanoid_ppo --gpu "RTX 4070" --set num_envs=4096 --set '
        "batch_size=1024 \\\n    --set num_minibatches=32 --set unroll_length=20"
    ),
    "guide-plan-dqn": _plan("memfit plan dqn_fire_raster --gpu 3.68GiB --host-memory 16GiB"),
    "guide-plan-dqn-device": Block(
        (
            Run(
                "memfit plan dqn_fire_raster@device_replay --gpu 3.7GB        # {} transitions",
                keep=_first("^Limited by", "^Note: 3.7GB"),
                comment=_buffer_size,
            ),
            Run(
                "memfit plan dqn_fire_raster@device_replay --gpu 3.68GiB      # {} transitions",
                keep=_first("^Limited by", "^Note: 3.68GiB"),
                comment=_buffer_size,
            ),
        )
    ),
    "guide-plan-dqn-fallback": Block(
        (
            Run(
                "memfit plan dqn_fire_raster@device_replay --gpu 3.68GiB --set "
                "buffer_size=200000 --host-memory 16GiB",
                keep=_from("│ buffer_size │"),
            ),
            Run("echo $?"),
        )
    ),
    "guide-plan-dqn-cpu": _plan(
        "memfit plan dqn_fire_raster --gpu cpu --host-memory 16GiB",
        keep=_first("^Limited by", "^Note: the host", "^Note: planned for", "^Note: margin"),
    ),
    "guide-plan-act": Block(
        (
            Run('memfit plan act_dual_camera --gpu "RTX 4060 Ti 8GB"'),
            Run(
                'memfit plan act_dual_camera@no_sim --gpu "RTX 4060 Ti 8GB"',
                keep=_first("^Limited by"),
            ),
        )
    ),
    "guide-plan-sac": Block(
        (
            Run(
                'memfit plan sac_pixels_8gb --gpu "RTX 4060 Ti 8GB"          # {}',
                keep=lambda _out: "",
                comment=lambda out: (
                    f"{_buffer_size(out)} frames "
                    + ("in host RAM" if "in host RAM besides" in out else "on the card")
                ),
            ),
            Run('memfit plan brax_mjx_sac@as_reported --gpu "RTX 4090"'),
            Run(
                'memfit plan brax_mjx_sac --gpu "RTX 4090"               # {}',
                keep=lambda _out: "",
                comment=lambda out: (
                    "max_replay_size=" + _buffer_size(out.replace("max_replay_size", "buffer_size"))
                ),
            ),
        )
    ),
    "guide-gpus": _plan("memfit gpus 4060"),
    "guide-show-write": Block(
        (
            Run("memfit show dqn_fire_raster > my_dqn.yaml && head -5 my_dqn.yaml"),
            Run(
                "memfit plan my_dqn.yaml --gpu 4060 --host-memory 16GiB --write fitted.yaml "
                "--force > /dev/null && head -5 fitted.yaml"
            ),
            Run("memfit plan fitted.yaml --json | grep -A2 '\"knobs\"'"),
        )
    ),
    "guide-check": Block(
        (
            Run(
                "memfit check brax_humanoid_ppo --set num_envs=131072 --set batch_size=128 "
                "--set num_minibatches=2"
            ),
            Run("echo $?"),
        )
    ),
    "workload-isaaclab3-go2": Block(
        tuple(
            Run(
                f'memfit plan isaaclab3_go2_locomotion{variant} --gpu "RTX 4060"',
                keep=_first(r"│ simulator_", r"│ num_envs", "^Limited by", "^Note: simulator"),
            )
            for variant in ("", "@newton")
        )
    ),
    "workload-isaaclab3-renderer": Block(
        (Run('memfit plan act_dual_camera --gpu "GTX 1650"'), Run("echo $?"))
    ),
    "guide-would-fit": _plan(
        "memfit plan dqn_fire_raster@device_replay --gpu 3.68GiB --set buffer_size=1000000 "
        '--host-memory 16GiB 2>&1 | grep -A3 "would fit"'
    ),
    "guide-example-brax": Block(
        (Run("python examples/brax_ppo/run.py --tiers 8,12,16,24 --out fitted.yaml"),),
        examples=True,
        # The docs are made on a machine without a GPU, where JAX falls back to its CPU
        # backend; named here, so that the CUDA plugin of the gpu-target extra does not log a
        # traceback about the missing driver first (JAX's own, not memfit's).
        env={"JAX_PLATFORMS": "cpu"},
        # what brax and JAX log on their own (warp is an optional brax backend; the CUDA
        # plugin logs through absl that this machine has no driver)
        drop=(
            r"^Failed to import (mujoco_)?warp",
            r"^Using JAX default device",
            r"^WARNING: All log messages before absl::InitializeLog\(\) is called",
            r"^[IWEF]\d{4} \d\d:\d\d:\d\d",
        ),
    ),
    "guide-example-dqn": Block(
        (Run("python examples/dqn_fire/run.py --host-memory 16GiB"),), examples=True
    ),
    "guide-example-act": Block((Run("python examples/act_dual_camera/run.py"),), examples=True),
    # the rehearsal prints the DQN lines, then the ACT ones: each guide section shows its own
    "guide-example-autoconfig-dqn": Block(
        (Run("python examples/autoconfig_rehearsal.py"),),
        examples=True,
        drop=(r"^\{'num_envs'", r"^note: "),
    ),
    "guide-example-autoconfig-act": Block(
        (Run("python examples/autoconfig_rehearsal.py"),),
        examples=True,
        drop=(r"^\{'buffer_size'",),
    ),
}


# --- the values ---------------------------------------------------------------------------------


class _Plans:
    """Plans through the Python API, each made once."""

    def __init__(self) -> None:
        self._done: dict[tuple[Any, ...], Any] = {}

    def __call__(self, workload: str, gpu: str, **kw: Any) -> Any:
        import memfit

        key = (workload, gpu, tuple(sorted(kw.items())))
        if key not in self._done:
            self._done[key] = memfit.plan(workload, gpu=gpu, **kw)
        return self._done[key]


def _n(value: Any) -> str:
    return f"{int(value):,}"


def _bytes(value: int) -> str:
    from memfit.units import format_bytes

    return format_bytes(value)


def _fraction_rule(_plans: _Plans) -> str:
    from memfit.allocator.xla_fraction import fraction_summary

    return fraction_summary().text()


def _card_fraction(card: str) -> Callable[[_Plans], str]:
    def value(_plans: _Plans) -> str:
        from memfit.allocator.xla_fraction import recommended_xla_fraction
        from memfit.hardware.catalog import gpu

        return recommended_xla_fraction(gpu(card)).value

    return value


G16 = 16 * 2**30

VALUES: dict[str, Callable[[_Plans], str]] = {
    "xla-fraction-rule": _fraction_rule,
    "xla-fraction-4070": _card_fraction("RTX 4070"),
    "xla-fraction-4090": _card_fraction("RTX 4090"),
    "brax-4070-needs": lambda p: _bytes(p("brax_humanoid_ppo", "RTX 4070").used_bytes),
    "brax-4070-headroom": lambda p: _bytes(p("brax_humanoid_ppo", "RTX 4070").headroom_bytes),
    "brax-1650-envs": lambda p: str(p("brax_humanoid_ppo", "GTX 1650").knobs["num_envs"]),
    "brax-8gb-envs": lambda p: str(p("brax_humanoid_ppo", "RTX 4060 Ti 8GB").knobs["num_envs"]),
    "dqn-host-buffer": lambda p: _n(
        p("dqn_fire_raster", "3.68GiB", host_memory_bytes=G16).knobs["buffer_size"]
    ),
    "dqn-host-bytes": lambda p: _bytes(
        p("dqn_fire_raster", "3.68GiB", host_memory_bytes=G16).host_bytes
    ),
    "dqn-device-peak": lambda p: _bytes(
        p("dqn_fire_raster", "3.68GiB", host_memory_bytes=G16).predicted_bytes
    ),
    "dqn-device-3.7GB": lambda p: _n(
        p("dqn_fire_raster@device_replay", "3.7GB").knobs["buffer_size"]
    ),
    "dqn-device-3.68GiB": lambda p: _n(
        p("dqn_fire_raster@device_replay", "3.68GiB").knobs["buffer_size"]
    ),
    "act-envs": lambda p: str(p("act_dual_camera", "RTX 4060 Ti 8GB").knobs["num_envs"]),
    "act-no-sim-envs": lambda p: str(
        p("act_dual_camera@no_sim", "RTX 4060 Ti 8GB").knobs["num_envs"]
    ),
    "act-4090-envs": lambda p: str(p("act_dual_camera", "RTX 4090").knobs["num_envs"]),
    "act-warp-envs": lambda p: str(
        p("act_dual_camera@newton_warp", "RTX 4060 Ti 8GB").knobs["num_envs"]
    ),
    "sac-mjx-replay": lambda p: _n(p("brax_mjx_sac", "RTX 4090").knobs["max_replay_size"]),
    "sac-mjx-buffer": lambda p: _bytes(p("brax_mjx_sac", "RTX 4090").breakdown["replay_buffer"]),
    "sac-pixels-host": lambda p: _n(p("sac_pixels_8gb", "RTX 4060 Ti 8GB").knobs["buffer_size"]),
    "skrl-envs": lambda p: _n(p("skrl_isaaclab_ppo", "RTX 4060 Ti 8GB").knobs["num_envs"]),
    "skrl-rollouts": lambda p: str(p("skrl_isaaclab_ppo", "RTX 4060 Ti 8GB").knobs["rollouts"]),
    "skrl-binding": lambda p: str(p("skrl_isaaclab_ppo", "RTX 4060 Ti 8GB").binding),
}


# --- regenerating and checking -------------------------------------------------------------------


@contextlib.contextmanager
def fixed_environment() -> Iterator[Path]:
    """A fresh temporary folder, no measurement cache, :data:`HOST_RAM` where a command does
    not name it; everything put back afterwards."""
    import memfit.planning

    saved = dict(os.environ)
    real_host_memory = memfit.planning.host_memory
    with tempfile.TemporaryDirectory(prefix="memfit-docs-") as tmp:
        os.environ["MEMFIT_CACHE_DIR"] = str(Path(tmp) / "cache")
        memfit.planning.host_memory = lambda: HOST_RAM  # type: ignore[assignment]
        try:
            yield Path(tmp)
        finally:
            memfit.planning.host_memory = real_host_memory  # type: ignore[assignment]
            os.environ.clear()
            os.environ.update(saved)


def render_block(name: str) -> str:
    """The text of block ``name`` as its commands print it now (fast blocks)."""
    block = BLOCKS[name]
    with fixed_environment() as tmp:
        work = tmp / "work"
        work.mkdir()
        state: dict[str, int] = {}
        return "".join(run.render(work, state) for run in block.runs)


def run_example(command: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """``python examples/...`` as a user runs it (a subprocess in ``cwd``, its temporary
    folder ``cwd/tmp``): stdout and stderr as a terminal shows them."""
    words = shlex.split(command)
    tmp = cwd / "tmp"
    tmp.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, str(ROOT / words[1]), *words[2:]],
        cwd=cwd,
        capture_output=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800,
        env={**os.environ, "TMPDIR": str(tmp), **(env or {})},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{done.stdout[-3000:]}")
    text = done.stdout.replace(str(tmp), "/tmp")
    return f"$ {command}\n" + "".join(line.rstrip() + "\n" for line in text.splitlines())


def render_example(name: str, cwd: Path | None = None) -> str:
    """The text of example block ``name`` as its commands print it now (run in ``cwd``,
    by default a temporary folder)."""
    block = BLOCKS[name]
    with contextlib.ExitStack() as stack:
        where = cwd or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="memfit-")))
        text = "".join(run_example(run.shown, where, block.env) for run in block.runs)
    return "".join(
        line + "\n"
        for line in text.splitlines()
        if not any(re.search(pattern, line) for pattern in block.drop)
    )


def shown_block(name: str) -> str:
    """The text the docs show now in block ``name``."""
    for text in _documents().values():
        for match in _OUTPUT.finditer(text):
            if match.group(1) == name:
                return match.group(3)
    raise KeyError(f"no block {name!r} in README.md or docs/")


#: Timings and what follows from them: left out where an example's output is compared.
_TIMING = re.compile(
    r"[+-]?\d+\.\d+(?!\d*\s*(?:[KMGT]i?B|GB|B\b))|\bfaster\b|\bslower\b|\(\d+\.\d s(; [a-z ]+)?\)"
    # a CPU run's resident host memory (the Recorder's "host" source) varies run to run
    r"|resident host memory \d+(?:\.\d+)? [KMGT]?i?B"
)


def normalise(text: str) -> str:
    """An example's output without what changes from run to run (timings, whether a
    measurement came from the cache, a CPU run's resident host memory, and the width of a
    table's columns of timings)."""
    # a column of timings is as wide as its widest one: spaces between cells do not count
    return re.sub(r"[ \t]+", " ", _TIMING.sub("#", text))


def _documents() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in DOCS}


def _names_in(texts: dict[Path, str]) -> tuple[dict[str, Path], dict[str, list[Path]]]:
    blocks: dict[str, Path] = {}
    values: dict[str, list[Path]] = {}
    for path, text in texts.items():
        for match in _OUTPUT.finditer(text):
            blocks[match.group(1)] = path
        for match in _VALUE.finditer(text):
            values.setdefault(match.group(1), []).append(path)
    return blocks, values


def expected(only: str = "all", examples: dict[str, str] | None = None) -> dict[Path, str]:
    """Every document as it should read: each selected block and value regenerated.

    ``only``: ``"fast"`` (the blocks run in this process, and the values), ``"examples"``
    (the examples' blocks), or ``"all"``. ``examples``: their outputs, already run.
    """
    texts = _documents()
    blocks, values = _names_in(texts)
    unknown = sorted((set(blocks) - set(BLOCKS)) | (set(values) - set(VALUES)))
    missing = sorted((set(BLOCKS) - set(blocks)) | (set(VALUES) - set(values)))
    if unknown or missing:
        raise SystemExit(
            f"docs markers and bench/docs_outputs.py disagree: unknown in the docs {unknown}, "
            f"not in the docs {missing}"
        )
    rendered: dict[str, str] = {}
    for name, block in BLOCKS.items():
        if block.examples and only in ("examples", "all"):
            rendered[name] = (examples or {}).get(name) or render_example(name)
        elif not block.examples and only in ("fast", "all"):
            rendered[name] = render_block(name)
    figures: dict[str, str] = {}
    if only in ("fast", "all"):
        plans = _Plans()
        with fixed_environment():
            figures = {name: fn(plans) for name, fn in VALUES.items()}
    out: dict[Path, str] = {}
    for path, text in texts.items():

        def block(match: re.Match[str]) -> str:
            name = match.group(1)
            body = rendered.get(name, match.group(3))
            return f"<!-- memfit-output: {name} -->\n{match.group(2)}{body}{match.group(4)}"

        def value(match: re.Match[str]) -> str:
            name = match.group(1)
            figure = figures.get(name, match.group(2))
            return f"<!-- memfit-value: {name} -->{figure}<!-- /memfit-value -->"

        out[path] = _VALUE.sub(value, _OUTPUT.sub(block, text))
    return out


def stale(only: str = "fast", examples: dict[str, str] | None = None) -> str:
    """A unified diff of every document whose shown outputs are stale ('' when none is);
    the examples' blocks are compared after :func:`normalise`."""
    now = _documents()
    want = expected(only, examples)
    diffs = []
    for path, text in now.items():
        have, should = text, want[path]
        if only == "examples":
            have, should = normalise(have), normalise(should)
        if have != should:
            diffs.extend(
                difflib.unified_diff(
                    have.splitlines(keepends=True),
                    should.splitlines(keepends=True),
                    f"{path.relative_to(ROOT)} (as it is)",
                    f"{path.relative_to(ROOT)} (as the code prints it now)",
                )
            )
    return "".join(diffs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", action="store_true", help="regenerate in place")
    what.add_argument("--check", action="store_true", help="exit 1 where one is stale")
    ap.add_argument("--only", choices=("fast", "examples", "all"), default="all")
    args = ap.parse_args(argv)
    if args.write:
        for path, text in expected(args.only).items():
            if path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path.relative_to(ROOT)}")
        return 0
    diff = stale("fast" if args.only == "all" else args.only)
    if args.only == "all":
        diff += stale("examples")
    if diff:
        sys.stdout.write(diff)
        print(f"\nshown outputs are stale: run `{REGENERATE}` and commit the docs")
        return 1
    print("every shown output matches what the code prints")
    return 0


if __name__ == "__main__":
    # before memfit's consoles exist: pipes lay tables out as wide as their content
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    sys.exit(main())
