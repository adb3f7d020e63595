"""Measure a GPU simulator on the user's card: the figures the next plan uses.

Inside a running simulator process (Isaac Lab after its ``AppLauncher``, Genesis after
``gs.init``, any simulator whose environments are created and closed in one process),
:func:`measure_simulator` reads the device's used memory, creates the environment at two or
three settings (numbers of environments, camera sizes), steps it a few times, reads the
device again and closes it. What each creation added fits

    added = fixed + per_env x num_envs + pixel x camera pixels

(the camera pixels counted as the planner counts them: each tiled camera's render product, a
square grid of tiles; each standard camera per env), and the result, a
:class:`memfit.core.simulator.MeasuredSimulator` for this card and simulator version, is
written to the measurement cache (``$MEMFIT_CACHE_DIR``, else ``~/.cache/memfit``, folder
``measurements``). :func:`memfit.plan` (``measure="auto"``, the default) finds it there for
a workload whose ``simulator:`` is the same simulator planned on the same card, and plans
with it; ``memfit simulator --reading`` fits readings taken by hand (``nvidia-smi`` while
the script runs at each setting) the same way.

The base is the device's used memory before the first environment plus the fit's fixed
part, less the CUDA context and cuBLAS workspace memfit models for the card (the plan adds
those itself). Readings are device-wide: close other GPU programs while measuring.

>>> from memfit.runtime.sim_measure import SimReading, fit_readings
>>> readings = [SimReading({"num_envs": n}, n, 0, 3 * 2**30 + n * 2**20, 3 * 2**30)
...             for n in (64, 256)]
>>> m = fit_readings(readings, gpu="NVIDIA GeForce RTX 4090", context_bytes=2**30)
>>> m.base_bytes == 2 * 2**30, m.per_env_bytes == 2**20, m.pixel_bytes is None
(True, True, True)
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from memfit._checks import parse_int, require, require_iterable, require_list
from memfit.backends.live import torch_device_memory
from memfit.core.simulator import MeasuredSimulator, SimCamera, SimFigures, camera_bytes
from memfit.core.simulator_figures import SHARED
from memfit.errors import BackendUnavailable, ConfigError

__all__ = [
    "SimReading",
    "cache_dir",
    "camera_pixels",
    "check_backend",
    "check_cameras",
    "check_num_envs",
    "find_measurement",
    "fit_readings",
    "measure_simulator",
    "measurement_key",
    "modelled_overhead_bytes",
    "store_measurement",
    "with_simulator_measurement",
]

_UNIT = SimFigures(
    base_bytes=0,
    render_base_bytes=0,
    viewport_bytes=0,
    per_env_bytes=0,
    pixel_bytes=1.0,
    shared_pixel_bytes=0.0,
    extra_type_fraction=SHARED.extra_type_fraction,
    standard_factor=SHARED.standard_factor,
)


@dataclass(frozen=True)
class SimReading:
    """One setting and what the device held.

    Attributes:
        settings: What was set, for the record (``{"num_envs": 64, "height": 128}``).
        num_envs: Environments created.
        pixels: Camera pixels as the planner counts them (:func:`camera_pixels`).
        device_used_bytes: The device's used memory with the environment created and
            stepped.
        before_bytes: The device's used memory just before it was created.
    """

    settings: dict[str, Any]
    num_envs: int
    pixels: int
    device_used_bytes: int
    before_bytes: int

    @property
    def added_bytes(self) -> int:
        """What creating and stepping the environment added."""
        return self.device_used_bytes - self.before_bytes


#: The most environments a reading may have: Isaac Lab and Genesis index environments with
#: 32-bit integers.
MAX_ENVS = 2**31 - 1
#: The most pixels a measured camera image may have a side (no renderer memfit models
#: renders wider: Vulkan's ``maxImageDimension2D`` is 32,768 on NVIDIA's drivers).
MAX_CAMERA_SIDE = 65_536
#: The most cameras of one kind an environment may have in a reading.
MAX_CAMERAS = 1024

_CAMERA_HINT = (
    'give each camera as {"height": 128, "width": 128} (with "count", "kind": "tiled" or '
    '"standard", "data_types": ["rgb"])'
)


def check_num_envs(key: str, value: object, *, hint: str | None = None) -> int:
    """``value`` when it is a number of environments a reading can have (1 to
    :data:`MAX_ENVS`).

    Raises:
        ConfigError: Otherwise, naming ``key``.
    """
    hint = hint or 'give each setting as {"num_envs": N}, N from 1 to 2**31 - 1'
    if isinstance(value, bool) or not isinstance(value, int):
        require(key, value, "int", hint=hint)
    assert isinstance(value, int)
    return parse_int(key, value, lo=1, hi=MAX_ENVS, hint=hint)


def check_cameras(key: str, cameras: object) -> list[SimCamera]:
    """The cameras of a measured setting (a list of mappings, each a simulator camera with
    numbers for its sizes), checked as one: ``key[i].field`` names what is wrong.

    Raises:
        ConfigError: For anything that is not such a list; never a raw validation error.
    """
    items = require_iterable(key, cameras)
    parsed: list[SimCamera] = []
    for i, camera in enumerate(items):
        where = f"{key}[{i}]"
        require(where, camera, "mapping", hint=_CAMERA_HINT)
        assert isinstance(camera, Mapping)
        for field, hi in (("height", MAX_CAMERA_SIDE), ("width", MAX_CAMERA_SIDE)):
            if field not in camera:
                raise ConfigError(f"{where} has no {field}", key_path=where, hint=_CAMERA_HINT)
            size = _number(f"{where}.{field}", camera[field])
            parse_int(f"{where}.{field}", size, lo=1, hi=hi, hint=_CAMERA_HINT)
        if "count" in camera:
            count = _number(f"{where}.count", camera["count"])
            parse_int(f"{where}.count", count, lo=1, hi=MAX_CAMERAS, hint=_CAMERA_HINT)
        try:
            parsed.append(SimCamera.model_validate(dict(camera)))
        except ValidationError as exc:
            raise _camera_error(where, exc) from None
    return parsed


def _number(key: str, value: object) -> int:
    """A measured camera's size is a number (a knob's name means nothing here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        require(key, value, "int", hint="a measured camera's size in pixels, e.g. 128")
    assert isinstance(value, int)
    return value


def _camera_error(where: str, exc: ValidationError) -> ConfigError:
    """The first problem pydantic found, as a ConfigError naming the camera's field."""
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"] if isinstance(p, str) and p not in ("int", "str"))
    path = f"{where}.{loc}" if loc else where
    message = str(err["msg"]).removeprefix("Value error, ")
    message = "must be " + message.removeprefix("Input should be ")
    if err["type"] == "extra_forbidden":
        message = "is not a camera field (height, width, count, kind, data_types)"
    elif err["type"] == "literal_error":
        message = f"{message}, not {err.get('input')!r:.40}"
    return ConfigError(f"{path} {message}", key_path=path, hint=_CAMERA_HINT)


def camera_pixels(cameras: Sequence[Mapping[str, Any]] | None, num_envs: int) -> int:
    """Pixels of ``cameras`` (``{"height", "width", "count", "kind", "data_types"}`` each)
    for ``num_envs`` environments, counted as the planner counts them: each tiled camera's
    render product (a square grid of tiles), each standard camera per env at the standard
    camera's factor, each further data type at its fraction; so a fitted bytes-per-pixel is
    the plan's ``pixel_bytes``.

    Raises:
        ConfigError: A camera or a number of environments that cannot be real
            (:func:`check_cameras`, :func:`check_num_envs`).
    """
    envs = check_num_envs("num_envs", num_envs)
    if cameras is None:
        return 0
    parsed = check_cameras("cameras", cameras)
    return camera_bytes(parsed, {}, envs, _UNIT) if parsed else 0


def _solve(readings: Sequence[SimReading]) -> tuple[float, float, float | None, str | None]:
    """Least squares ``added = fixed + per_env x N (+ pixel x P)``; the pixel column only when
    the pixels vary apart from the environments."""
    import numpy as np  # numpy comes with every simulator memfit measures

    n = np.array([r.num_envs for r in readings], dtype=float)
    p = np.array([r.pixels for r in readings], dtype=float)
    y = np.array([r.added_bytes for r in readings], dtype=float)
    note = None
    if p.any():
        a = np.column_stack([np.ones_like(n), n, p])
        if np.linalg.matrix_rank(a) == 3:
            (fixed, per_env, pixel), *_ = np.linalg.lstsq(a, y, rcond=None)
            return float(fixed), float(per_env), float(pixel), None
        note = (
            "the camera pixels grew with the environments only: the cameras are counted in "
            "the per-env figure (measure a second camera size to separate them)"
        )
    a = np.column_stack([np.ones_like(n), n])
    (fixed, per_env), *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(fixed), float(per_env), None, note


def fit_readings(
    readings: Sequence[SimReading],
    *,
    gpu: str,
    context_bytes: int,
    simulator: str = "isaac_sim",
    version: str | None = None,
    start_bytes: int | None = None,
    physics: str | None = None,
    renderer: str | None = None,
) -> MeasuredSimulator:
    """Fit the simulator's figures from readings at two or more settings.

    Args:
        readings: The settings and what the device held at each.
        gpu: The card's name, as the driver reports it.
        context_bytes: The CUDA context and library workspaces memfit models for the card
            (taken out of the base: the plan adds them itself).
        simulator: What was measured (the workload's ``simulator.preset`` or name).
        version: The simulator's version.
        start_bytes: The device's used memory before the first environment (default: the
            first reading's ``before_bytes``).
        physics: Isaac Lab 3's physics backend that ran (``physx``, ``newton``).
        renderer: Isaac Lab 3's renderer that ran (``rtx``, ``newton_warp``, ``ovrtx``,
            ``none``).

    Raises:
        ConfigError: With fewer than two readings, readings at a single number of
            environments, or an unknown physics backend or renderer.
    """
    check_backend(physics, renderer)
    if len(readings) < 2 or len({r.num_envs for r in readings}) < 2:
        raise ConfigError(
            "a simulator measurement needs readings at two or more numbers of environments",
            key_path="readings",
            hint="read the device at, say, 16 and 64 environments (and a second camera size)",
        )
    fixed, per_env, pixel, note = _solve(readings)
    start = readings[0].before_bytes if start_bytes is None else start_bytes
    taken = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    record = [
        {
            "settings": dict(r.settings),
            "num_envs": r.num_envs,
            "pixels": r.pixels,
            "device_used_bytes": r.device_used_bytes,
            "before_bytes": r.before_bytes,
        }
        for r in readings
    ]
    if note is not None:
        record.append({"note": note})
    return MeasuredSimulator(
        gpu=gpu,
        simulator=simulator,
        version=version,
        physics=physics,  # type: ignore[arg-type]  # checked above
        renderer=renderer,  # type: ignore[arg-type]
        rendering=any(r.pixels for r in readings),
        base_bytes=max(0, round(start + fixed - context_bytes)),
        per_env_bytes=max(0, round(per_env)),
        pixel_bytes=None if pixel is None else max(0.0, round(pixel, 2)),
        context_bytes=context_bytes,
        readings=record,
        taken=taken.replace("+00:00", "Z"),
    )


def cache_dir() -> Path:
    """Where measurements are cached: ``$MEMFIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/memfit``,
    else ``~/.cache/memfit`` (a ``measurements`` folder inside)."""
    root = os.environ.get("MEMFIT_CACHE_DIR")
    if root:
        return Path(root) / "measurements"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "memfit" / "measurements"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "x"


def check_backend(physics: str | None, renderer: str | None) -> None:
    """Raise :class:`ConfigError` for a physics backend or renderer memfit has no name for."""
    from memfit.core.simulator import PHYSICS, RENDERERS

    for key, value, names in (("physics", physics, PHYSICS), ("renderer", renderer, RENDERERS)):
        if value is not None and value not in names:
            raise ConfigError(
                f"{key} must be one of {', '.join(names)}, not {value!r}",
                key_path=key,
                hint=f"Isaac Lab 3's {key}: " + "; ".join(f"{k}: {v}" for k, v in names.items()),
            )


def measurement_key(simulator: str, physics: str | None, renderer: str | None) -> str:
    """What a measurement is stored under: the simulator, and for Isaac Lab 3 its physics
    backend and renderer (``isaac_sim-newton-newton_warp``)."""
    if physics is None and renderer is None:
        return simulator
    return f"{simulator}-{physics or 'physx'}-{renderer or 'rtx'}"


def _path(simulator: str, gpu: str, version: str | None, directory: Path | None) -> Path:
    name = f"simulator-{_slug(simulator)}-{_slug(gpu)}-{_slug(version or 'any')}.json"
    return (directory or cache_dir()) / name


def store_measurement(measured: MeasuredSimulator, directory: Path | None = None) -> Path:
    """Write ``measured`` to the cache (atomically); returns the file.

    Raises:
        ConfigError: When the cache folder cannot be written.
    """
    key = measurement_key(measured.simulator or "custom", measured.physics, measured.renderer)
    path = _path(key, measured.gpu, measured.version, directory)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(measured.model_dump(), indent=2))
        tmp.replace(path)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the measurement to {path}: {exc.strerror or exc}",
            key_path="directory",
            hint="set MEMFIT_CACHE_DIR to a folder you can write",
        ) from exc
    return path


def _read(path: Path) -> MeasuredSimulator | None:
    try:
        return MeasuredSimulator.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None  # an unreadable or outdated entry is as good as none


def find_measurement(
    simulator: str, gpu: str, version: str | None = None, directory: Path | None = None
) -> tuple[MeasuredSimulator, Path] | None:
    """The stored measurement of ``simulator`` on ``gpu``: of ``version`` when given, else
    the most recent one of any version; ``None`` when there is none."""
    if version is not None:
        path = _path(simulator, gpu, version, directory)
        found = _read(path) if path.is_file() else None
        return (found, path) if found is not None else None
    folder = directory or cache_dir()
    pattern = f"simulator-{_slug(simulator)}-{_slug(gpu)}-*.json"
    best: tuple[MeasuredSimulator, Path] | None = None
    for path in sorted(folder.glob(pattern)) if folder.is_dir() else []:
        found = _read(path)
        if found is not None and (best is None or (found.taken or "") > (best[0].taken or "")):
            best = (found, path)
    return best


def with_simulator_measurement(
    workload: Any, gpu: str, measure: str = "auto", directory: Path | None = None
) -> tuple[Any, list[str]]:
    """The workload with the stored measurement of its simulator on ``gpu`` attached
    (``measure`` ``auto`` or ``fresh``; ``recorded`` keeps only the workload's own), and a
    note saying where it came from."""
    sim = getattr(workload, "simulator", None)
    if sim is None or sim.measured is not None or measure == "recorded":
        return workload, []
    name = sim.preset if sim.preset != "custom" else (sim.name or "custom")
    if sim.lab3():  # Isaac Lab 3: the measurement of this backend and renderer
        name = measurement_key(name, *sim.backend())
    found = find_measurement(name, gpu, sim.version, directory)
    if found is None:
        return workload, []
    measured, path = found
    attached = workload.model_copy(
        update={"simulator": sim.model_copy(update={"measured": measured})}
    )
    when = f", {measured.taken}" if measured.taken else ""
    version = f" {measured.version}" if measured.version else ""
    return attached, [f"simulator figures measured on {gpu} ({name}{version}{when}): {path}"]


def _probe_reader(device: int, probe: Any | None) -> tuple[Callable[[], int], str]:
    """A function reading the device's used memory, and the device's name."""
    if probe is not None:

        def from_probe() -> int:
            dev, total = probe.snapshot().sized_device(device, by_name_hint="pass probe=")
            used = dev.device_used_bytes
            return int(used if used is not None else total - (dev.free_bytes or 0))

        return from_probe, str(probe.snapshot().devices[device].name)
    from memfit.runtime.allocator_env import torch_cuda_initialized

    if torch_cuda_initialized():
        import torch

        def from_torch() -> int:
            free, total = torch_device_memory(torch, device)
            return total - free

        return from_torch, str(torch.cuda.get_device_name(device))
    from memfit.backends import local_probe

    nvml, reasons = local_probe(try_torch=False)
    if nvml is None:
        raise BackendUnavailable(
            "no device to read: " + ("; ".join(reasons) or "no GPU found"),
            hint="measure inside the simulator's process on the GPU machine, or pass probe=",
        )
    return _probe_reader(device, nvml)


def modelled_overhead_bytes(gpu: str) -> int:
    """The CUDA context and cuBLAS workspace memfit models for ``gpu``."""
    from memfit.backends.software import target_runtime
    from memfit.hardware.catalog import gpu as catalog_gpu
    from memfit.hardware.cuda import cublas_workspace_bytes
    from memfit.hardware.runtime import cuda_context

    try:
        spec = catalog_gpu(gpu)
    except ConfigError:
        spec = None
    return cuda_context(spec, target_runtime(None)).bytes + cublas_workspace_bytes(spec)


def measure_simulator(
    make_env: Callable[[dict[str, Any]], Any],
    points: Sequence[Mapping[str, Any]] = ({"num_envs": 16}, {"num_envs": 64}),
    *,
    step: Callable[[Any], Any] | None = None,
    steps: int = 10,
    close: Callable[[Any], Any] | None = None,
    simulator: str = "isaac_sim",
    version: str | None = None,
    device: int = 0,
    probe: Any | None = None,
    context_bytes: int | None = None,
    store: bool = True,
    directory: Path | None = None,
    physics: str | None = None,
    renderer: str | None = None,
) -> MeasuredSimulator:
    """Measure the simulator in this process at two or three settings and store the result.

    Args:
        make_env: Creates the environment at one setting: called with a point's mapping
            (``{"num_envs": 64, "cameras": [{"height": 128, "width": 128}]}``).
        points: The settings: each a mapping with ``num_envs`` and, for a run with cameras,
            ``cameras`` (``height``, ``width``, ``count``, ``kind``, ``data_types`` each, as
            in the workload's ``simulator.cameras``); two numbers of environments at least,
            and a second camera size to separate the cameras from the environments.
        step: Steps the environment once (the readings after a few steps are the steady
            ones: the first steps allocate); ``None``: not stepped.
        steps: How many times to call ``step`` before reading.
        close: Closes the environment (default: its ``close()``).
        simulator: What is measured (the workload's ``simulator.preset``, or its name).
        version: The simulator's version (a plan uses the measurement of its version).
        device: The device index.
        probe: A device probe to read instead of the device (tests, rehearsals:
            :class:`memfit.backends.SimulatedDevice`).
        context_bytes: The CUDA context and workspaces to take out of the base (default:
            memfit's estimate for the card).
        store: Write the result to the measurement cache.
        directory: The cache folder (default :func:`cache_dir`).
        physics: Isaac Lab 3's physics backend that runs (``physx``, ``newton``): a plan
            uses the measurement for that backend only.
        renderer: Isaac Lab 3's renderer that runs (``rtx``, ``newton_warp``, ``ovrtx``,
            ``none``).

    Returns:
        The measurement (its ``readings`` hold every setting and reading).

    Raises:
        ConfigError: On a bad argument, or readings at a single number of environments.
        BackendUnavailable: When nothing can read the device here.
    """
    require("make_env", make_env, "callable")
    require("step", step, "callable", optional=True)
    require("close", close, "callable", optional=True)
    require("steps", steps, "int")
    require("simulator", simulator, "str")
    require("version", version, "str", optional=True)
    require("device", device, "int")
    require("context_bytes", context_bytes, "int", optional=True)
    require("store", store, "bool")
    require("directory", directory, "path", optional=True)
    require("physics", physics, "str", optional=True)
    require("renderer", renderer, "str", optional=True)
    check_backend(physics, renderer)
    if probe is not None and not callable(getattr(probe, "snapshot", None)):
        require("probe", probe, "callable")  # a DeviceProbe has snapshot()
    require_list(
        "points",
        points,
        what="a list of settings",
        sequence=True,
        nonempty=True,
        hint='give two or three settings: [{"num_envs": 16}, {"num_envs": 64}]',
    )
    directory = Path(directory) if directory is not None else None
    for i, point in enumerate(points):
        require(f"points[{i}]", point, "mapping", hint='give each point as {"num_envs": N}')
        assert isinstance(point, Mapping)
        if "num_envs" not in point:
            raise ConfigError(
                f"points[{i}] has no num_envs",
                key_path=f"points[{i}].num_envs",
                hint='give each point as {"num_envs": N} (with "cameras" for a camera run)',
            )
        check_num_envs(f"points[{i}].num_envs", point["num_envs"])
        if point.get("cameras") is not None:
            check_cameras(f"points[{i}].cameras", point["cameras"])
    read, name = _probe_reader(device, probe)
    start = read()
    readings: list[SimReading] = []
    for point in points:
        settings = dict(point)
        before = read()
        env = make_env(settings)
        for _ in range(steps if step is not None else 0):
            step(env)  # type: ignore[misc]
        used = read()
        if close is not None:
            close(env)
        elif callable(getattr(env, "close", None)):
            env.close()
        del env
        gc.collect()
        _empty_cache()
        readings.append(
            SimReading(
                settings=settings,
                num_envs=int(settings["num_envs"]),
                pixels=camera_pixels(settings.get("cameras"), int(settings["num_envs"])),
                device_used_bytes=used,
                before_bytes=before,
            )
        )
    context = modelled_overhead_bytes(name) if context_bytes is None else context_bytes
    result = fit_readings(
        readings,
        gpu=name,
        context_bytes=context,
        simulator=simulator,
        version=version,
        start_bytes=start,
        physics=physics,
        renderer=renderer,
    )
    if store:
        store_measurement(result, directory)
    return result


def _empty_cache() -> None:
    """Give torch's cached blocks back, so the next reading starts from what is held."""
    from memfit.runtime.allocator_env import torch_cuda_initialized

    if torch_cuda_initialized():
        import torch

        torch.cuda.empty_cache()
