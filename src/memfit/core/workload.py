"""The workload file: schema, loading and validation.

A workload describes one training or inference job in YAML: its fixed facts (framework,
precision, optimizer, networks, observations, environment state per env, devices), the knobs a
planner may tune (named as the framework names its arguments), the throughput proxy to
maximise, and the rules the knobs must keep. ``docs/workload.md`` documents every field.

Loading (:func:`load_workload`) reports every user mistake as a
:class:`memfit.errors.ConfigError` that says where it is:

* a YAML syntax error names the file, line and column (``fire.yaml:12:3``);
* an unknown key names its path and suggests the nearest known key ("did you mean ...");
* a value of the wrong type or out of range names its key path and what is allowed.

Bundled workloads live in ``memfit/workloads/*.yaml`` and are loaded by name
(``load_workload("brax_humanoid_ppo")``); a variant is picked with ``name@variant``
(``brax_humanoid_ppo@quick``), which deep-merges the file's ``variants.<variant>`` section
over the base document before validation.

>>> w = load_workload("brax_humanoid_ppo@quick")
>>> w.family, w.framework, sorted(w.knobs)[:2]
('ppo', 'jax', ['batch_size', 'num_envs'])
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from memfit.core.measured import BraxMeasurements
from memfit.core.simulator import SimulatorSpec
from memfit.errors import ConfigError, did_you_mean, file_error, read_user_text
from memfit.units import parse_bytes

__all__ = [
    "BUNDLED_DIR",
    "CameraSpec",
    "ConvLayer",
    "DeviceSpec",
    "EffectiveBatch",
    "JaxSettings",
    "KnobSpec",
    "NetworkSpec",
    "Observations",
    "OffPolicySpec",
    "PpoSpec",
    "RasterSpec",
    "Rule",
    "TransformerSpec",
    "VisionSpec",
    "Workload",
    "bundled_names",
    "dtype_bytes",
    "load_workload",
    "parse_workload",
]

#: Folder of the bundled workload files, shipped inside the package.
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "workloads"

#: Most values one knob may take (the planner enumerates them).
MAX_KNOB_VALUES = 4096

_DTYPE_BYTES: dict[str, int] = {
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "float16": 2,
    "bfloat16": 2,
    "int16": 2,
    "float32": 4,
    "int32": 4,
    "float64": 8,
    "int64": 8,
}

Dtype = Literal[
    "uint8", "int8", "bool", "float16", "bfloat16", "int16", "float32", "int32", "float64", "int64"
]


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name (``"float32"`` -> 4).

    Raises:
        ConfigError: When the dtype is not one memfit knows.
    """
    try:
        return _DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(
            f"unknown dtype {dtype!r}", hint=f"use one of {', '.join(sorted(_DTYPE_BYTES))}"
        ) from None


class _Strict(BaseModel):
    """Base of every schema model: unknown keys are errors, models are frozen, and values are
    not coerced (``num_envs: true`` or ``action_dim: "8"`` is an error, not 1 or 8)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _size(value: Any) -> Any:
    """Accept ``"512MiB"`` or a plain int for a size field."""
    if isinstance(value, str):
        return parse_bytes(value)
    return value


class KnobSpec(_Strict):
    """A tunable parameter: a range (``min``/``max`` with ``step`` or ``powers_of_two``) or
    ``choices``, a ``default`` (what ``check`` tests without ``--set``) and a ``priority``
    (knobs with a higher priority are kept high; lower ones shrink first)."""

    min: int | None = Field(default=None, ge=1)
    max: int | None = Field(default=None, ge=1)
    step: int | None = Field(default=None, ge=1)
    powers_of_two: bool = False
    choices: list[Annotated[int, Field(ge=1)]] | None = None
    default: int | None = Field(default=None, ge=1)
    priority: int = 0
    description: str | None = None

    @model_validator(mode="after")
    def _check_domain(self) -> KnobSpec:
        if self.choices is not None:
            if self.min is not None or self.max is not None or self.step or self.powers_of_two:
                raise ValueError("give either choices or min/max, not both")
            if not self.choices:
                raise ValueError("choices must not be empty")
            return self
        if self.min is None or self.max is None:
            raise ValueError("a knob needs choices, or both min and max")
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        if self.powers_of_two and self.step is not None:
            raise ValueError("give either step or powers_of_two, not both")
        if self.powers_of_two and self.min & (self.min - 1):
            raise ValueError(f"min ({self.min}) is not a power of two")
        if not self.powers_of_two:
            count = (self.max - self.min) // (self.step or 1) + 1
            if count > MAX_KNOB_VALUES:
                raise ValueError(
                    f"{count} values is too many to search (at most {MAX_KNOB_VALUES}); "
                    "use a larger step or powers_of_two"
                )
        return self

    def values(self) -> tuple[int, ...]:
        """Every value the knob may take, ascending and without duplicates."""
        if self.choices is not None:
            return tuple(sorted(set(self.choices)))
        assert self.min is not None and self.max is not None  # checked by the validator
        if self.powers_of_two:
            out = []
            value = self.min
            while value <= self.max:
                out.append(value)
                value *= 2
            return tuple(out)
        return tuple(range(self.min, self.max + 1, self.step or 1))

    def describe(self) -> str:
        """The domain in words (``"powers of two 128..8192"``, ``"one of 5, 10, 20"``)."""
        if self.choices is not None:
            return "one of " + ", ".join(str(v) for v in self.values())
        if self.powers_of_two:
            return f"powers of two {self.min}..{self.max}"
        step = f" step {self.step}" if self.step and self.step > 1 else ""
        return f"{self.min}..{self.max}{step}"


class Rule(_Strict):
    """A user rule over knobs: exactly one of ``divisible_by``, ``min``, ``max``, ``choices``
    (each with ``knob``) or ``expr`` (a boolean expression over knob and setting names)."""

    knob: str | None = None
    divisible_by: int | None = Field(default=None, ge=1)
    min: int | None = None
    max: int | None = None
    choices: list[int] | None = None
    expr: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Rule:
        kinds = [
            k
            for k in ("divisible_by", "min", "max", "choices", "expr")
            if getattr(self, k) is not None
        ]
        if len(kinds) != 1:
            raise ValueError(
                "a rule needs exactly one of divisible_by, min, max, choices, expr "
                f"(got {', '.join(kinds) or 'none'})"
            )
        if kinds[0] != "expr" and self.knob is None:
            raise ValueError(f"a {kinds[0]} rule needs knob: NAME")
        if kinds[0] == "expr" and self.knob is not None:
            raise ValueError("an expr rule names its knobs inside the expression; drop knob")
        return self


class Constraints(_Strict):
    """Preset rule sets (``brax_ppo``, ``rl_games``, ``cleanrl``) and user rules."""

    presets: list[Literal["brax_ppo", "rl_games", "cleanrl"]] = Field(default_factory=list)
    rules: list[Rule] = Field(default_factory=list)


class ConvLayer(_Strict):
    """A convolution (``kind: conv``) or pooling (``kind: pool``) layer, repeated ``repeat``
    times (later repeats use stride 1, as in a ResNet stage)."""

    kind: Literal["conv", "pool"] = "conv"
    out_channels: int | None = Field(default=None, ge=1)
    kernel: int = Field(ge=1)
    stride: int = Field(default=1, ge=1)
    padding: int = Field(default=0, ge=0)
    repeat: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _channels(self) -> ConvLayer:
        if self.kind == "conv" and self.out_channels is None:
            raise ValueError("a conv layer needs out_channels")
        if self.kind == "pool" and self.out_channels is not None:
            raise ValueError("a pool layer keeps its channels; drop out_channels")
        return self


class NetworkSpec(_Strict):
    """A network: ``params`` (a parameter count), or ``layers`` (MLP widths after the input,
    output last) optionally after ``conv`` layers over the raster or camera input."""

    params: int | None = Field(default=None, ge=1)
    layers: list[Annotated[int, Field(ge=1)]] | None = None
    conv: list[ConvLayer] | None = None
    input: Literal["vector", "raster", "camera"] | None = None
    target: bool = False
    activation_items: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _shape(self) -> NetworkSpec:
        if self.params is None and self.layers is None and self.conv is None:
            raise ValueError("a network needs params, layers or conv")
        if self.params is not None and (self.layers is not None or self.conv is not None):
            raise ValueError("give either params or layers/conv, not both")
        return self


class RasterSpec(_Strict):
    """A 2-D grid observation (fire-spread maps, occupancy grids): channels x height x width."""

    channels: int = Field(ge=1)
    height: int = Field(ge=1)
    width: int = Field(ge=1)
    dtype: Dtype = "float32"


class CameraSpec(_Strict):
    """Cameras: ``count`` frames of height x width x channels each, ``frame_stack`` deep.

    ``height`` and ``width`` may name a knob or setting instead of a number.
    """

    count: int = Field(default=1, ge=1)
    height: int | str
    width: int | str
    channels: int = Field(default=3, ge=1)
    dtype: Dtype = "uint8"
    frame_stack: int = Field(default=1, ge=1)


class Observations(_Strict):
    """What one environment observes per step."""

    vector: int = Field(default=0, ge=0)
    dtype: Dtype = "float32"
    raster: RasterSpec | None = None
    cameras: CameraSpec | None = None


class DeviceSpec(_Strict):
    """Devices the job runs on and how it spreads over them; memory terms are per device."""

    count: int = Field(default=1, ge=1)
    strategy: Literal["single", "ddp", "fsdp", "pmap"] = "single"

    @model_validator(mode="after")
    def _single(self) -> DeviceSpec:
        if self.strategy == "single" and self.count != 1:
            raise ValueError(f"strategy single runs on one device, not {self.count}")
        return self


class JaxSettings(_Strict):
    """JAX's allocator: preallocation (``XLA_PYTHON_CLIENT_PREALLOCATE``) and its fraction
    (``XLA_PYTHON_CLIENT_MEM_FRACTION``). Without ``mem_fraction`` the plan uses the fraction
    memfit recommends for the card (:func:`memfit.core.budget.recommended_xla_fraction`: 0.90
    on cards of 8 GB or more) and says to set it; give one to plan with yours (JAX's own
    default is 0.75)."""

    preallocate: bool = True
    mem_fraction: float | None = Field(default=None, gt=0, le=1)


class PpoSpec(_Strict):
    """On-policy layout: ``brax`` (``num_envs``, ``batch_size``, ``num_minibatches``,
    ``unroll_length``), ``cleanrl`` (``num_envs``, ``num_steps``, ``num_minibatches``) or
    ``rl_games`` (``num_actors``, ``horizon_length``, ``minibatch_size``). ``store_value``: a
    Brax-layout variant that also keeps the value estimate in every transition."""

    layout: Literal["brax", "cleanrl", "rl_games"] = "brax"
    store_value: bool = False


class OffPolicySpec(_Strict):
    """Replay buffer (Stable-Baselines3 / CleanRL layout) and target network."""

    placement: Literal["gpu", "host", "auto"] = "gpu"
    optimize_memory_usage: bool = False
    action_dtype: Dtype = "int64"


class TransformerSpec(_Strict):
    """An encoder/decoder over image-feature tokens (ACT): width, feed-forward width, heads."""

    dim_model: int = Field(ge=1)
    ff_dim: int = Field(ge=1)
    heads: int = Field(default=8, ge=1)
    extra_tokens: int = Field(default=2, ge=0)


class VisionSpec(_Strict):
    """Policy rollout with cameras (ACT-style): backbone, transformer, action chunks."""

    backbone: list[ConvLayer]
    transformer: TransformerSpec | None = None
    chunk_size: int = Field(default=1, ge=1)
    autocast: bool = False


class EffectiveBatch(_Strict):
    """Trade micro-batch for gradient accumulation: ``micro * accumulation == value``."""

    micro: str
    accumulation: str
    value: int = Field(ge=1)


def _family(name: str) -> Any:
    """The registered family ``name`` (:mod:`memfit.core.families.registry`), imported here
    rather than at the top: the family modules import this schema."""
    from memfit.core.families import get_family

    return get_family(name)


class Workload(_Strict):
    """A validated workload file. See ``docs/workload.md`` for every field."""

    name: str = "workload"
    description: str | None = None
    family: str
    framework: Literal["torch", "jax"] = "torch"
    precision: Literal["fp32", "bf16", "fp16", "amp"] = "fp32"
    optimizer: Literal["adam", "adamw", "sgd", "sgd_momentum", "rmsprop", "none"] = "adam"
    optimizer_states: int | None = Field(default=None, ge=0)
    networks: dict[str, NetworkSpec] = Field(default_factory=dict)
    observations: Observations = Field(default_factory=Observations)
    action_dim: int = Field(default=1, ge=1)
    env_state_bytes: int = Field(default=0, ge=0)
    env: str | None = None
    backend: str | None = None
    measurements: BraxMeasurements | None = None
    simulator: SimulatorSpec | None = None
    devices: DeviceSpec = Field(default_factory=DeviceSpec)
    jax: JaxSettings = Field(default_factory=JaxSettings)
    ppo: PpoSpec | None = None
    replay: OffPolicySpec | None = None
    vision: VisionSpec | None = None
    terms: dict[str, int | str] | None = None
    settings: dict[str, int] = Field(default_factory=dict)
    knobs: dict[str, KnobSpec] = Field(default_factory=dict)
    objective: str | None = None
    effective_batch: EffectiveBatch | None = None
    constraints: Constraints = Field(default_factory=Constraints)
    estimator: Literal["analytic", "torch", "jax"] = "analytic"
    factory: str | None = None
    host_memory_bytes: int | None = Field(default=None, ge=0)
    source: str | None = None

    _size_fields = field_validator("env_state_bytes", "host_memory_bytes", mode="before")(_size)

    @field_validator("family")
    @classmethod
    def _known_family(cls, value: str) -> str:
        from memfit.core.families import family_names

        known = family_names()
        if value not in known:
            raise PydanticCustomError(
                "literal_error",
                "Input should be {expected}",
                {"expected": ", ".join(repr(k) for k in known[:-1]) + f" or {known[-1]!r}"},
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Workload:
        overlap = sorted(set(self.knobs) & set(self.settings))
        if overlap:
            raise ValueError(f"{', '.join(overlap)} is both a knob and a setting; keep one")
        names = set(self.knobs) | set(self.settings)
        family = _family(self.family)
        key = family.family_key(self)
        missing = [n for n in family.required_names(self) if n not in names]
        if missing:
            raise ValueError(f"the {key} model needs {', '.join(missing)} as a knob or a setting")
        for field_name, message in family.requires:
            if not getattr(self, field_name):
                raise ValueError(message)
        if self.env is not None:
            kind, _, env_name = self.env.partition(":")
            if kind != "brax" or not env_name:
                raise ValueError(
                    f"env {self.env!r}: name it as brax:<environment> (brax:humanoid, brax:ant); "
                    "other kinds of environment give env_state_bytes instead"
                )
            if self.family_key != "ppo/brax":
                raise ValueError(f"env {self.env} needs family ppo with ppo: {{layout: brax}}")
        if self.backend is not None and self.env is None:
            raise ValueError("backend names the env's physics pipeline: give env: brax:<name>")
        if self.measurements is not None:
            if self.env is None or self.measurements.env != self.env:
                raise ValueError(
                    f"measurements are of {self.measurements.env!r}, not of env {self.env!r}"
                )
            if self.measurements.backend != self.backend:
                raise ValueError(
                    f"measurements were taken with backend {self.measurements.backend!r}, "
                    f"not {self.backend!r}"
                )
        if self.estimator != "analytic" and not self.factory:
            raise ValueError(f"estimator {self.estimator} needs factory: module:function")
        if self.factory is not None and ":" not in self.factory:
            raise ValueError(f"factory must be module:function, not {self.factory!r}")
        if self.effective_batch is not None:
            eb = self.effective_batch
            for role, name in (("micro", eb.micro), ("accumulation", eb.accumulation)):
                if name not in self.knobs:
                    raise ValueError(f"effective_batch.{role} {name!r} is not a knob")
        cams = self.observations.cameras
        if cams is not None:
            for axis in ("height", "width"):
                ref = getattr(cams, axis)
                if isinstance(ref, str) and ref not in names:
                    raise ValueError(
                        f"observations.cameras.{axis} names {ref!r}, which is neither a knob "
                        "nor a setting"
                    )
        return self

    @property
    def family_key(self) -> str:
        """``"ppo/brax"``, ``"offpolicy"``, ... : the family and, for PPO, its layout."""
        key: str = _family(self.family).family_key(self)
        return key

    @property
    def device_count(self) -> int:
        """Devices the job spreads over."""
        return self.devices.count

    def objective_expr(self) -> str:
        """The throughput proxy to maximise (default: the product of every knob)."""
        if self.objective:
            return self.objective
        if not self.knobs:
            return "1"
        return " * ".join(sorted(self.knobs))

    def default_values(self) -> dict[str, int]:
        """Settings and knob defaults (knobs without a default are left out)."""
        values = dict(self.settings)
        for name, knob in self.knobs.items():
            if knob.default is not None:
                values[name] = knob.default
        return values


# --------------------------------------------------------------------------------------------
# Loading


def bundled_names() -> list[str]:
    """Names of the bundled workloads and their variants (``brax_humanoid_ppo@quick``)."""
    names: list[str] = []
    for path in sorted(BUNDLED_DIR.glob("*.yaml")):
        names.append(path.stem)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError:
            continue
        variants = data.get("variants") if isinstance(data, dict) else None
        if isinstance(variants, dict):
            names.extend(f"{path.stem}@{v}" for v in variants)
    return names


def _resolve(ref: str | Path) -> tuple[Path, str | None]:
    """Find the file for a path or a bundled name; split off an ``@variant``."""
    text = str(ref)
    variant: str | None = None
    path = Path(text)
    if not path.is_file() and "@" in text:
        text, variant = text.rsplit("@", 1)
        path = Path(text)
    if path.is_file():
        return path, variant
    bundled = BUNDLED_DIR / f"{text}.yaml"
    if bundled.is_file() and "/" not in text and "\\" not in text:
        return bundled, variant  # a bundled name wins over a folder of the same name
    if path.exists():
        return path, variant  # a folder: reading it says so
    known = [p.stem for p in sorted(BUNDLED_DIR.glob("*.yaml"))]
    raise ConfigError(
        f"no workload file or bundled workload named {text!r}",
        hint=did_you_mean(
            text,
            known,
            otherwise=f"give a path to a YAML file, or one of: {', '.join(known)} "
            "(memfit examples)",
        ),
    )


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_workload(ref: str | Path | Workload, *, variant: str | None = None) -> Workload:
    """Load and validate a workload file or a bundled workload.

    Args:
        ref: A path to a YAML file, a bundled name (``"dqn_fire_raster"``), a bundled name with
            a variant (``"brax_humanoid_ppo@production"``), or an already loaded workload.
        variant: A variant to apply (same as ``@variant``).

    Returns:
        The validated workload.

    Raises:
        ConfigError: When the file is missing, is not valid YAML (the key path is
            ``file:line:column``), has an unknown key (with a did-you-mean hint), or a value of
            the wrong type or out of range (the key path names it), or the variant is unknown.
    """
    if isinstance(ref, Workload):
        return ref
    try:
        path, at_variant = _resolve(ref)
    except OSError as exc:  # a path the system cannot even look up (a name too long, ...)
        raise file_error(exc, str(ref), action="read the workload file") from exc
    text = read_user_text(path, what="the workload file")
    return parse_workload(
        text, source=str(path), variant=variant or at_variant, default_name=path.stem
    )


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML
    keeps the last silently, so a second ``knobs:`` section would replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                first = seen[key].start_mark
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first given on line {first.line + 1})",
                    key_node.start_mark,
                )
            if isinstance(key, (str, int, float, bool)):
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _yaml_hint(exc: yaml.MarkedYAMLError) -> str:
    problem = exc.problem or ""
    if problem.startswith("duplicate key"):
        return "give each key once; merge the two entries into one"
    if "constructor for the tag" in problem:
        return "workload files are plain YAML: remove the '!!' tag"
    if "'\\t'" in problem:
        return "indent with spaces; YAML does not allow tabs"
    return "check the indentation and the punctuation (':', '-', quotes) at that spot"


def parse_workload(
    text: str, *, source: str = "<workload>", variant: str | None = None, default_name: str = ""
) -> Workload:
    """Validate workload YAML text (see :func:`load_workload`).

    Raises:
        ConfigError: On a syntax error, an unknown key, a wrong type or range, or an unknown
            variant; the key path says where.
    """
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = exc.problem or "invalid YAML"
        raise ConfigError(
            f"YAML syntax error: {problem}", key_path=where, hint=_yaml_hint(exc)
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"YAML error: {exc}", key_path=source, hint="check that the file is YAML"
        ) from exc
    except RecursionError:
        raise ConfigError(
            "the YAML is nested too deeply to read (hundreds of levels or more)",
            key_path=source,
            hint="a workload file is a few levels deep; check that this is the right file",
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            "a workload file must be a mapping of keys to values",
            key_path=source,
            hint="start with 'family: ppo' (see docs/workload.md)",
        )
    variants = data.pop("variants", None)
    if variants is not None and not isinstance(variants, dict):
        raise ConfigError(
            "variants must be a mapping of name -> overrides",
            key_path="variants",
            hint="write variants: {quick: {knobs: ...}}",
        )
    if variant is not None and variant != "default":
        if not variants or variant not in variants:
            known = sorted(variants or {})
            raise ConfigError(
                f"unknown variant {variant!r}",
                key_path="variants",
                hint=f"variants here: {', '.join(known)}" if known else "this file has none",
            )
        override = variants[variant]
        if not isinstance(override, dict):
            raise ConfigError(
                "a variant must be a mapping",
                key_path=f"variants.{variant}",
                hint="a variant holds the keys it changes, e.g. {knobs: {num_envs: ...}}",
            )
        data = _merge(data, override)
        data.setdefault("name", default_name)
        data["name"] = f"{data['name']}@{variant}"
    data.setdefault("name", default_name or "workload")
    data["source"] = source
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        raise _translate(exc, text, source) from None


# --------------------------------------------------------------------------------------------
# Error translation


def _loc_text(loc: Sequence[int | str]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def _as_model(annotation: Any) -> type[BaseModel] | None:
    """The model class of ``X`` or ``X | None``; ``None`` for anything else."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return None


def _container_value(annotation: Any) -> Any:
    """For ``dict[str, X]`` / ``list[X]`` (possibly optional) the ``X``; else ``None``."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            inner = _container_value(arg)
            if inner is not None:
                return inner
        return None
    if origin is dict:
        return typing.get_args(annotation)[1]
    if origin is list:
        return typing.get_args(annotation)[0]
    return None


def _fields_at(loc: Sequence[int | str]) -> list[str]:
    """Known keys of the model that holds the key at ``loc`` (for did-you-mean)."""
    annotation: Any = Workload
    for item in loc[:-1]:
        model = _as_model(annotation)
        if model is not None:
            field = model.model_fields.get(str(item))
            if field is None:
                return []
            annotation = field.annotation
            continue
        inner = _container_value(annotation)
        if inner is None:
            return []
        annotation = inner
    model = _as_model(annotation)
    return sorted(model.model_fields) if model is not None else []


def _line_of(text: str, loc: Sequence[int | str]) -> tuple[int, int] | None:
    """1-based line and column of the key or item at ``loc`` in the YAML text, if found."""
    try:
        node: Any = yaml.compose(text)
    except yaml.YAMLError:
        return None
    mark = None
    for item in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(item, str):
            for key_node, value_node in node.value:
                if key_node.value == item:
                    mark, node = key_node.start_mark, value_node
                    break
            else:
                return (mark.line + 1, mark.column + 1) if mark else None
        elif isinstance(node, yaml.SequenceNode) and isinstance(item, int):
            if item >= len(node.value):
                break
            node = node.value[item]
            mark = node.start_mark
        else:
            break
    return (mark.line + 1, mark.column + 1) if mark else None


def _translate(exc: ValidationError, text: str, source: str) -> ConfigError:
    """The first validation problem as a ConfigError with key path, place and hint."""
    errors = exc.errors(include_url=False)
    # an unknown key first: a misspelt key also makes the key it stands for look missing
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    loc = [p for p in err["loc"] if isinstance(p, (int, str))]
    if loc and isinstance(loc[-1], str) and loc[-1].startswith("function-after"):
        loc = loc[:-1]
    # pydantic puts union branch names in the path ("int", "str"); drop them
    loc = [p for p in loc if p not in ("int", "str", "list[int]", "constrained-int")]
    if not loc and err["type"] == "value_error":
        # a whole-file check names its key first ("factory must be module:function, ...")
        first = str(err["msg"]).removeprefix("Value error, ").split(" ", 1)[0]
        if first.split(".", 1)[0] in Workload.model_fields:
            parts: list[int | str] = list(first.split("."))
            loc = parts
    key_path = _loc_text(loc) or "(top level)"
    place = _line_of(text, loc)
    where = f" ({source}:{place[0]}:{place[1]})" if place else f" ({source})"
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    kind = err["type"]
    if kind == "extra_forbidden":
        known = _fields_at(loc)
        unknown = str(loc[-1]) if loc else ""
        hint = did_you_mean(
            unknown,
            known,
            otherwise=f"known keys here: {', '.join(known)}" if known else None,
            cutoff=0.5,
        )
        return ConfigError(f"unknown key{where}{more}", key_path=key_path, hint=hint)
    if kind == "missing":
        return ConfigError(
            f"required key missing{where}{more}",
            key_path=key_path,
            hint="see docs/workload.md for the keys each family needs",
        )
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    got = err.get("input")
    got_text = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) else ""
    allowed = None
    ctx = err.get("ctx") or {}
    if "expected" in ctx:
        allowed = f"allowed: {ctx['expected']}"
    return ConfigError(
        f"{message}{got_text}{where}{more}",
        key_path=key_path,
        hint=allowed or "see docs/workload.md for what each key allows",
    )
