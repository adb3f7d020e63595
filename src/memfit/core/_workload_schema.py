"""The workload schema: the pydantic models of a workload file (see ``docs/workload.md``)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from memfit._checks import too_large_int
from memfit.core.families.registry import family_names, get_family
from memfit.core.measured import BraxMeasurements
from memfit.core.simulator import SimulatorSpec
from memfit.errors import ConfigError
from memfit.units import parse_bytes

#: ``env:`` naming the user's own environment factory (``mypkg.envs:make_env``).
_FACTORY = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*")

#: Most values one knob may take (the planner enumerates them).
MAX_KNOB_VALUES = 4096
#: Most devices one job may run on (the largest training clusters have about 10**5 GPUs).
MAX_DEVICES = 2**20

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

    @field_validator("*", mode="after")
    @classmethod
    def _bounded_ints(cls, value: Any) -> Any:
        """No integer of a workload is 2**63 or more in magnitude (a count or a size never
        is): a 24-digit ``optimizer_states`` or ``copies`` is an error here, not an overflow
        deep in the planner. Lists and mappings of integers are checked too."""
        digits = too_large_int(value)
        if digits is not None:
            raise PydanticCustomError(
                "int_too_large",
                "a number of about {digits} digits; no count or size is 2**63 or more",
                {"digits": digits},
            )
        return value


#: Most copies of one network (twin critics are 2; an ensemble of critics some tens).
MAX_COPIES = 1024
#: Most optimizer states per parameter (Adam keeps 2).
MAX_OPTIMIZER_STATES = 64
#: Most repeats of one conv layer (a ResNet-152 stage has 36).
MAX_REPEAT = 1024


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
    repeat: int = Field(default=1, ge=1, le=MAX_REPEAT)

    @model_validator(mode="after")
    def _channels(self) -> ConvLayer:
        if self.kind == "conv" and self.out_channels is None:
            raise ValueError("a conv layer needs out_channels")
        if self.kind == "pool" and self.out_channels is not None:
            raise ValueError("a pool layer keeps its channels; drop out_channels")
        return self


class NetworkSpec(_Strict):
    """A network: ``params`` (a parameter count), or ``layers`` (MLP widths after the input,
    output last) optionally after ``conv`` layers over the raster or camera input.

    ``trunk`` names another network whose output this one reads (a head on a shared encoder:
    one conv trunk, several heads; only the head's own parameters are counted here);
    ``action_input`` appends the action to the input (a critic ``Q(obs, action)``; after the
    conv layers when there are some); ``copies`` is the number of identical networks (twin
    critics: 2)."""

    params: int | None = Field(default=None, ge=1)
    layers: list[Annotated[int, Field(ge=1)]] | None = Field(default=None, min_length=1)
    conv: list[ConvLayer] | None = Field(default=None, min_length=1)
    input: Literal["vector", "raster", "camera"] | None = None
    target: bool = False
    activation_items: int | None = Field(default=None, ge=0)
    trunk: str | None = None
    action_input: bool = False
    copies: int = Field(default=1, ge=1, le=MAX_COPIES)

    @model_validator(mode="after")
    def _shape(self) -> NetworkSpec:
        if self.params is None and self.layers is None and self.conv is None:
            raise ValueError("a network needs params, layers or conv")
        if self.params is not None and (self.layers is not None or self.conv is not None):
            raise ValueError("give either params or layers/conv, not both")
        if self.trunk is not None and (self.conv is not None or self.input is not None):
            raise ValueError(
                "a head on a trunk reads the trunk's features: drop conv and input (give the "
                "conv layers to the trunk network)"
            )
        if self.trunk is not None and self.layers is None:
            raise ValueError("a head on a trunk needs layers: [widths]")
        return self


class RasterSpec(_Strict):
    """A 2-D grid observation (fire-spread maps, occupancy grids): channels x height x width,
    ``frame_stack`` deep (the last frames stacked as channels, as ``VecFrameStack`` does)."""

    channels: int = Field(ge=1)
    height: int = Field(ge=1)
    width: int = Field(ge=1)
    dtype: Dtype = "float32"
    frame_stack: int = Field(default=1, ge=1)


class CameraSpec(_Strict):
    """Cameras: ``count`` frames of height x width x channels each, ``frame_stack`` deep.

    ``height``, ``width`` and ``count`` may name a knob or setting instead of a number.
    """

    count: int | str = 1
    height: int | str
    width: int | str
    channels: int = Field(default=3, ge=1)
    dtype: Dtype = "uint8"
    frame_stack: int = Field(default=1, ge=1)

    @field_validator("count", "height", "width")
    @classmethod
    def _count(cls, value: int | str, info: ValidationInfo) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{info.field_name} must be at least 1 (or name a knob or setting)")
        return value


class Observations(_Strict):
    """What one environment observes per step.

    ``storage_dtype`` is the dtype a replay buffer or rollout storage keeps observations in
    (``uint8`` frames, ``float16`` rasters), when it is not each part's own: the network
    still reads them in their own dtype.
    """

    vector: int = Field(default=0, ge=0)
    dtype: Dtype = "float32"
    raster: RasterSpec | None = None
    cameras: CameraSpec | None = None
    storage_dtype: Dtype | None = None


class DeviceSpec(_Strict):
    """Devices the job runs on and how it spreads over them; memory terms are per device."""

    count: int = Field(default=1, ge=1, le=MAX_DEVICES)
    strategy: Literal["single", "ddp", "fsdp", "pmap"] = "single"
    #: How the GPUs are linked (``None``: as the card is usually built, see
    #: :func:`memfit.core.multi_gpu.default_topology`).
    topology: Literal["pcie", "nvlink", "nvswitch"] | None = None
    #: NCCL's version (``"2.21.5"``; ``None``: memfit's default).
    nccl: str | None = Field(default=None, pattern=r"^\d+\.\d+(\.\d+)?$")
    #: The job's ``NCCL_*`` variables (``NCCL_BUFFSIZE``, ``NCCL_NVLS_ENABLE``, ...).
    nccl_env: dict[str, str] = Field(default_factory=dict)
    #: DDP: gradients are views into its buckets (no second copy).
    gradient_as_bucket_view: bool = False
    #: DDP: bucket size in MiB (its default 25): the count of buckets, not their total.
    bucket_cap_mb: int = Field(default=25, ge=1, le=1 << 20)
    #: FSDP: what is sharded (``full_shard``, ``shard_grad_op``, ``hybrid_shard``, ``no_shard``).
    fsdp_sharding: Literal["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"] = "full_shard"
    #: Every process calls ``torch.cuda.set_device(local_rank)`` before touching CUDA (else
    #: each leaves a CUDA context on device 0).
    set_device: bool = True
    #: With ``set_device: false``, what first started CUDA in those processes: ``nccl``
    #: (``init_process_group("nccl")`` first: an eager context), ``torch`` (a torch CUDA
    #: call first: the runtime's loading), ``unknown`` (the larger); see
    #: :func:`memfit.core.multi_gpu.stray_context`.
    stray_init: Literal["unknown", "nccl", "torch"] = "unknown"
    #: With ``set_device: false``, what each other process allocates on device 0 besides its
    #: context (``"1.5GiB"``: a checkpoint ``torch.load`` restores to ``cuda:0``).
    stray_bytes: int = Field(default=0, ge=0)
    #: The job calls send/recv or all-to-all (NCCL connects every peer).
    all_to_all: bool = False
    #: With ``all_to_all``, the peers each rank sends to and receives from (``None``: every
    #: other rank, an all-to-all; 1 for a ring shift such as XLA's collective-permute over a
    #: ring; 2 for a pipeline stage): NCCL connects only the peers a rank talks to.
    p2p_peers: int | None = Field(default=None, ge=1, le=1023)
    #: NCCL communicators each device joins (``None``: by framework and strategy, see
    #: :func:`memfit.core.multi_gpu.default_communicators`: 1 per device group for JAX
    #: (2 for jaxlib before 0.4.30, whose XLA kept a clique per stream), 1 for torch's
    #: process group).
    communicators: int | None = Field(default=None, ge=1, le=64)

    _stray_size = field_validator("stray_bytes", mode="before")(_size)

    @model_validator(mode="after")
    def _single(self) -> DeviceSpec:
        if self.strategy == "single" and self.count != 1:
            raise ValueError(f"strategy single runs on one device, not {self.count}")
        return self


class JaxSettings(_Strict):
    """JAX's allocator: preallocation (``XLA_PYTHON_CLIENT_PREALLOCATE``) and its fraction
    (``XLA_PYTHON_CLIENT_MEM_FRACTION``). Without ``mem_fraction`` the plan uses the fraction
    memfit recommends for the card
    (:func:`memfit.allocator.xla_fraction.recommended_xla_fraction`: 0.90 on cards of 8 GB or
    more) and says to set it; give one to plan with yours (JAX's own
    default is 0.75)."""

    preallocate: bool = True
    mem_fraction: float | None = Field(default=None, gt=0, le=1)


class PpoSpec(_Strict):
    """On-policy layout: ``brax`` (``num_envs``, ``batch_size``, ``num_minibatches``,
    ``unroll_length``), ``cleanrl`` (``num_envs``, ``num_steps``, ``num_minibatches``),
    ``rl_games`` (``num_actors``, ``horizon_length``, ``minibatch_size``), ``skrl``
    (``num_envs``, ``rollouts``, ``mini_batches``: skrl's PPO and its ``RandomMemory``) or
    ``rsl_rl`` (``num_envs``, ``num_steps_per_env``, ``num_mini_batches``: RSL-RL's PPO and
    its ``RolloutStorage``, as Isaac Lab's ``rsl_rl`` scripts run it).
    ``store_value``: a Brax-layout variant that also keeps the value estimate in every
    transition."""

    layout: Literal["brax", "cleanrl", "rl_games", "skrl", "rsl_rl"] = "brax"
    store_value: bool = False


class OffPolicySpec(_Strict):
    """Replay buffer (Stable-Baselines3 / CleanRL layout) and target network."""

    placement: Literal["gpu", "host", "auto"] = "gpu"
    optimize_memory_usage: bool = False
    action_dtype: Dtype = "int64"


class SacReplaySpec(_Strict):
    """The replay buffer of an actor-critic off-policy job (SAC, TD3, DrQ).

    ``storage``: ``transitions`` (Stable-Baselines3's ``ReplayBuffer``, skrl's
    ``RandomMemory``: observation and next observation, action, reward, done, timeout per
    transition; ``optimize_memory_usage`` drops the next observation), ``frames`` (pixels
    stored once: one frame per step, stacks and next observations rebuilt by index when
    sampled, as DrQ-v2's replay and frame-stacking buffers do) or ``flat`` (Brax's
    ``UniformSamplingQueue``: one float32 row per transition: observation, action, reward,
    discount, next observation, truncation). ``placement`` as for ``replay:``."""

    placement: Literal["gpu", "host", "auto"] = "gpu"
    storage: Literal["transitions", "frames", "flat"] = "transitions"
    optimize_memory_usage: bool = False
    action_dtype: Dtype = "float32"

    @model_validator(mode="after")
    def _storage(self) -> SacReplaySpec:
        if self.optimize_memory_usage and self.storage != "transitions":
            raise ValueError(
                f"optimize_memory_usage applies to storage transitions; {self.storage} "
                "storage already decides what is stored"
            )
        if self.storage == "flat" and self.action_dtype != "float32":
            raise ValueError("flat storage keeps every field as float32 (Brax's replay)")
        return self


class SacSpec(_Strict):
    """Actor-critic off-policy settings (``family: sac``).

    ``algorithm``: ``sac`` (entropy temperature), ``td3`` (target actor, no temperature),
    ``drq`` (SAC from pixels with image augmentation of each sampled batch). ``actor`` and
    ``critic`` name the networks (the critic's target is a ``target: true`` network);
    ``capacity`` and ``batch`` name the knobs or settings that hold the replay capacity and
    the batch size, as the framework names them (Brax: ``max_replay_size``; SB3:
    ``buffer_size``; skrl: ``memory_size``). ``updates_per_step``: a knob or setting for
    gradient updates sampled at once (Brax's ``grad_updates_per_step``), else 1.
    ``entropy``: ``learned`` (a log-temperature with its own optimizer) or ``fixed``.
    ``augmentation``: the sampled observations are augmented into a float32 copy (DrQ's
    random shift; default on for ``drq``)."""

    algorithm: Literal["sac", "td3", "drq"] = "sac"
    actor: str = "actor"
    critic: str = "critic"
    capacity: str = "buffer_size"
    batch: str = "batch_size"
    updates_per_step: str | None = None
    entropy: Literal["learned", "fixed"] = "learned"
    augmentation: bool | None = None
    normalize_observations: bool = False
    replay: SacReplaySpec = Field(default_factory=SacReplaySpec)


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


class FeatureExtractorSpec(_Strict):
    """A frozen image encoder run on every environment's camera frames each step, its
    features part of the learner's observation (Isaac Lab's ``image_features`` observation
    term with a ResNet-18): a part of the job next to its learner, not a family of its own.

    It holds its parameters (frozen: no gradients, no optimizer state), the frames as a
    float copy, and under inference mode one layer's input and output at a time (with
    ``batch_norm``, a convolution's output and its normalised copy). ``height``, ``width``
    and ``count`` (images per environment) default to ``observations.cameras``."""

    name: str | None = None
    params: int = Field(ge=1)
    backbone: list[ConvLayer] = Field(min_length=1)
    batch_norm: bool = True
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    channels: int = Field(default=3, ge=1)
    height: int | str | None = None
    width: int | str | None = None
    count: int | str | None = None

    @model_validator(mode="after")
    def _input(self) -> FeatureExtractorSpec:
        if (self.height is None) != (self.width is None):
            raise ValueError("give both height and width, or neither (the cameras' size)")
        return self


class EffectiveBatch(_Strict):
    """Trade micro-batch for gradient accumulation: ``micro * accumulation == value``."""

    micro: str
    accumulation: str
    value: int = Field(ge=1)


class PlannedFor(_Strict):
    """What a fitted file (``memfit plan --write``) was planned for: ``memfit plan FILE``
    without ``--gpu`` plans for it again (``--gpu``, ``--margin``, ``--runtime`` override)."""

    gpu: str = Field(min_length=1, max_length=200)
    margin: float | None = Field(default=None, ge=0, lt=1)
    runtime: str | None = Field(default=None, min_length=1, max_length=500)


def _family(name: str) -> Any:
    """The registered family ``name`` (:mod:`memfit.core.families.registry`)."""
    return get_family(name)


class Workload(_Strict):
    """A validated workload file. See ``docs/workload.md`` for every field."""

    name: str = "workload"
    description: str | None = None
    family: str
    framework: Literal["torch", "jax"] = "torch"
    precision: Literal["fp32", "bf16", "fp16", "amp"] = "fp32"
    optimizer: Literal["adam", "adamw", "sgd", "sgd_momentum", "rmsprop", "none"] = "adam"
    optimizer_states: int | None = Field(default=None, ge=0, le=MAX_OPTIMIZER_STATES)
    networks: dict[str, NetworkSpec] = Field(default_factory=dict)
    observations: Observations = Field(default_factory=Observations)
    action_dim: int = Field(default=1, ge=1)
    env_state_bytes: int = Field(default=0, ge=0)
    env: str | None = None
    backend: str | None = None
    measurements: BraxMeasurements | None = None
    simulator: SimulatorSpec | None = None
    #: ``gpus:`` is the same block under another name (``gpus: {count: 8, topology: nvswitch}``).
    devices: DeviceSpec = Field(
        default_factory=DeviceSpec, validation_alias=AliasChoices("devices", "gpus")
    )
    jax: JaxSettings = Field(default_factory=JaxSettings)
    ppo: PpoSpec | None = None
    replay: OffPolicySpec | None = None
    sac: SacSpec | None = None
    vision: VisionSpec | None = None
    feature_extractor: FeatureExtractorSpec | None = None
    terms: dict[str, int | str] | None = None
    #: Values the job runs with; positive integers, as `--set NAME=VALUE` takes them.
    settings: dict[str, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)
    knobs: dict[str, KnobSpec] = Field(default_factory=dict)
    objective: str | None = Field(default=None, min_length=1, pattern=r"\S")
    effective_batch: EffectiveBatch | None = None
    constraints: Constraints = Field(default_factory=Constraints)
    estimator: Literal["analytic", "torch", "jax"] = "analytic"
    factory: str | None = None
    host_memory_bytes: int | None = Field(default=None, ge=0)
    planned_for: PlannedFor | None = None
    source: str | None = None

    _size_fields = field_validator("env_state_bytes", "host_memory_bytes", mode="before")(_size)

    @field_validator("family")
    @classmethod
    def _known_family(cls, value: str) -> str:
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
        self._check_trunks()
        problem = family.check(self) if family.check is not None else None
        if problem:
            raise ValueError(problem)
        if self.env is not None:
            kind, _, env_name = self.env.partition(":")
            if not env_name or (kind != "brax" and not _FACTORY.fullmatch(self.env)):
                raise ValueError(
                    f"env {self.env!r}: name it as brax:<environment> (brax:humanoid, brax:ant) "
                    "or point at your own factory as module:function (mypkg.envs:make_env); "
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
        refs = self.simulator.names() if self.simulator is not None else []
        fx = self.feature_extractor
        if fx is not None:
            refs += [
                (f"feature_extractor.{a}", getattr(fx, a))
                for a in ("height", "width", "count")
                if isinstance(getattr(fx, a), str)
            ]
            if fx.height is None and self.observations.cameras is None:
                raise ValueError(
                    "feature_extractor reads observations.cameras: add them, or give its "
                    "height and width"
                )
        for key_path, ref in refs:
            if ref not in names:
                raise ValueError(f"{key_path} names {ref!r}, which is neither a knob nor a setting")
        cams = self.observations.cameras
        if cams is not None:
            for axis in ("height", "width", "count"):
                ref = getattr(cams, axis)
                if isinstance(ref, str) and ref not in names:
                    raise ValueError(
                        f"observations.cameras.{axis} names {ref!r}, which is neither a knob "
                        "nor a setting"
                    )
        return self

    def _check_trunks(self) -> None:
        """Every ``trunk`` names another network, and no chain of trunks loops: each network
        is walked once (time linear in the networks, however long the chains)."""
        done: set[str] = set()
        for name in self.networks:
            path: list[str] = []
            on_path: set[str] = set()
            current: str | None = name
            while current is not None and current not in done:
                if current in on_path:
                    loop = path[path.index(current) :]
                    raise ValueError(
                        "networks loop through their trunks: "
                        + " -> ".join([*loop[:8], "..."] if len(loop) > 8 else loop)
                        + f" -> {current}"
                    )
                path.append(current)
                on_path.add(current)
                trunk = self.networks[current].trunk
                if trunk is not None and trunk not in self.networks:
                    raise ValueError(
                        f"networks.{current}.trunk names {trunk!r}, which is not a network "
                        f"(networks: {', '.join(sorted(self.networks)[:20])})"
                    )
                current = trunk
            done.update(path)

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
