"""skrl, Isaac Lab's reference RL library: an agent's update and rollout that survive
out-of-memory, the Recorder fed from skrl's trainer, and its memory knobs planned.

:func:`guard` installs three wrappers on one skrl agent (PPO, SAC, TD3, ... of
``skrl.agents.torch``), as instance attributes, so skrl's own trainers
(``SequentialTrainer``, ``StepTrainer``) call them without a change:

* ``agent.update`` (skrl's algorithm update): before it runs, the agent's state is saved:
  every model, preprocessor, optimizer, learning-rate scheduler and gradient scaler (to host
  memory), its tensors (SAC's ``log_entropy_coefficient``), the random generators (the
  memory's shuffling), its tracked data, and each memory tensor the update overwrites
  (PPO's ``values``, ``returns``, ``advantages``; saved on first write). On out-of-memory the
  update is undone and run again from the same state, so a transient failure leaves the
  parameters exactly as an uninterrupted run's; when the same update fails ``retries``
  times in a row, a PPO-style agent runs it with twice the ``mini_batches`` (smaller
  minibatches, an event says so: this changes the learning, not the data) up to
  ``max_mini_batches``, then gives up with :class:`memfit.errors.OutOfMemory`;
* ``agent.act`` under :class:`memfit.RolloutGuard`: an out-of-memory while choosing the
  actions of all environments is retried (random generators restored), then run in chunks
  of the environments; the per-chunk values the agent keeps for the transition it records
  next (PPO's ``_current_log_prob`` and ``_current_values``) are joined, so no environment's
  transition is lost;
* ``agent.post_interaction``: after skrl's own (which runs the update), ``recorder.step``
  at the trainer's timestep, and, with ``track=True``, the sample's allocated and reserved
  MiB through skrl's ``track_data`` (so skrl's TensorBoard writer shows them).

:func:`knobs_of` and :func:`apply_knobs` map skrl's memory knobs (``rollouts``,
``mini_batches``, ``batch_size``, ``gradient_steps`` of the agent's config, the memory's
``memory_size`` and ``num_envs``) to a workload's knob names and back;
:func:`autoconfig` plans a workload against the device now (after the simulator started)
and writes the agent's knobs into its config.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from memfit._checks import require as require_arg
from memfit._checks import require_callable, require_mapping, require_object, require_positive_int
from memfit._lazy import require
from memfit.errors import ConfigError
from memfit.runtime._memory import free_memory, memory_figures, out_of_memory
from memfit.runtime._rewind import RngState, rng_state
from memfit.runtime.events import EventSink, MemoryEvent, emit
from memfit.runtime.oom import forget_exception, is_oom

__all__ = ["AGENT_KNOBS", "SkrlGuard", "apply_knobs", "autoconfig", "guard", "knobs_of"]

#: Agent config fields that shape memory, named as skrl names them (PPO/A2C/RPO:
#: ``rollouts``, ``mini_batches``; SAC/TD3/DDPG: ``batch_size``, ``gradient_steps``).
AGENT_KNOBS: tuple[str, ...] = ("rollouts", "mini_batches", "batch_size", "gradient_steps")


_AGENT_HINT = "pass an agent of skrl.agents.torch (PPO, SAC, ...), after it is made"
_CFG_HINT = "pass PPO_CFG(...) / SAC_CFG(...) or Isaac Lab's agent dict"


def _require_agent(agent: Any, *, optional: bool = False, guarded: bool = False) -> None:
    """An skrl agent (``act`` and ``update``); one to guard also has ``post_interaction``
    and takes the wrappers of its methods (no ``__slots__``)."""
    require_object(
        "agent",
        agent,
        methods=("act", "update", "post_interaction") if guarded else ("act", "update"),
        what="an skrl agent",
        hint=_AGENT_HINT,
        optional=optional,
        wrapped=guarded,
    )


def _require_cfg(cfg: Any, *, optional: bool = False) -> None:
    if cfg is None and optional:
        return
    if isinstance(cfg, Mapping) or (dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)):
        return
    raise ConfigError(
        f"an skrl agent config is a dataclass or a dict, not {type(cfg).__name__}",
        key_path="cfg",
        hint=_CFG_HINT,
    )


def _cfg_get(cfg: Any, name: str) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(name)
    return getattr(cfg, name, None)


def knobs_of(
    agent: Any | None = None,
    *,
    cfg: Any | None = None,
    memory: Any | None = None,
    num_envs: int | None = None,
) -> dict[str, int]:
    """The memory knobs of an skrl agent (or of its config and memory), by skrl's names.

    Args:
        agent: An skrl agent (its ``cfg`` and ``memory`` are read).
        cfg: An agent config (``PPO_CFG``, ``SAC_CFG``, or the dict of one) instead.
        memory: An skrl memory (``memory_size``, ``num_envs``) instead of the agent's.
        num_envs: The number of environments, when no memory says it.

    Returns:
        ``rollouts``, ``mini_batches``, ``batch_size``, ``gradient_steps`` (those the config
        has), ``memory_size`` and ``num_envs`` (when known).

    Raises:
        ConfigError: When an argument is not what it names (an agent, a config, a memory, a
            positive number of environments).
    """
    _require_agent(agent, optional=True)
    _require_cfg(cfg, optional=True)
    require_object(
        "memory",
        memory,
        attributes=("memory_size", "num_envs"),
        what="an skrl memory",
        optional=True,
    )
    if num_envs is not None:
        require_positive_int("num_envs", num_envs)
    if agent is not None:
        cfg = cfg if cfg is not None else getattr(agent, "cfg", None)
        memory = memory if memory is not None else getattr(agent, "memory", None)
    out: dict[str, int] = {}
    for name in AGENT_KNOBS:
        value = _cfg_get(cfg, name) if cfg is not None else None
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = value
    if memory is not None:
        for name in ("memory_size", "num_envs"):
            out[name] = require_positive_int(f"memory.{name}", getattr(memory, name))
    if num_envs is not None:
        out["num_envs"] = num_envs
    return out


def apply_knobs(cfg: Any, knobs: Mapping[str, Any]) -> Any:
    """A copy of an skrl agent config with the knobs it has set from ``knobs``.

    Args:
        cfg: ``PPO_CFG``/``SAC_CFG``/... (a dataclass) or its dict form (Isaac Lab's
            ``agent`` section).
        knobs: Knob values by skrl's names (a plan's ``knobs``); names the config does not
            have (``num_envs``, ``memory_size``: the env's and the memory's) are left out.

    Returns:
        The updated copy (the input is not changed).

    Raises:
        ConfigError: When ``cfg`` is neither a dataclass nor a mapping, or ``knobs`` is not a
            mapping whose agent knobs are positive integers.
    """
    _require_cfg(cfg)
    require_mapping("knobs", knobs, hint="the plan's knobs: result.knobs")
    chosen = {
        k: require_positive_int(f"knobs.{k}", v) for k, v in knobs.items() if k in AGENT_KNOBS
    }
    if isinstance(cfg, Mapping):
        return {**cfg, **{k: v for k, v in chosen.items() if k in cfg}}
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        names = {f.name for f in dataclasses.fields(cfg)}
        return dataclasses.replace(cfg, **{k: v for k, v in chosen.items() if k in names})
    raise ConfigError(
        f"an skrl agent config is a dataclass or a dict, not {type(cfg).__name__}",
        key_path="cfg",
        hint="pass PPO_CFG(...) / SAC_CFG(...) or Isaac Lab's agent dict",
    )


def autoconfig(cfg: Any, workload: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Plan ``workload`` against the device now and write the agent's knobs into ``cfg``.

    Call it after the simulator has started (Isaac Lab) and before the agent and its memory
    are made; build the memory with ``memory_size = result.knobs.get("memory_size",
    rollouts)`` and the env with ``result.knobs["num_envs"]`` when they are knobs.

    Args:
        cfg: The agent config (dataclass or dict).
        workload: A workload, path or bundled name (``"skrl_isaaclab_ppo"``).
        **kwargs: Passed to :func:`memfit.autoconfig` (``overrides``, ``probe``, ...).

    Returns:
        ``(updated cfg, AutoConfig)``.

    Raises:
        InfeasiblePlan: When nothing fits what is free.
        BackendUnavailable: When no device can be read.
        ConfigError: When ``cfg`` is not an agent config, or as :func:`memfit.autoconfig`.
    """
    from memfit.runtime.autoconfig import autoconfig as _autoconfig

    _require_cfg(cfg)
    result = _autoconfig(workload, **kwargs)
    return apply_knobs(cfg, result.knobs), result


# -- the update's state --------------------------------------------------------------------


def _to_host(tree: Any) -> Any:
    """A deep copy of a state dict with every tensor copied to host memory."""
    torch: Any = require("torch")
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _to_host(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_to_host(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_to_host(v) for v in tree)
    return tree


def _stateful(agent: Any) -> tuple[list[Any], list[tuple[str, Any]]]:
    """The agent's objects with a ``state_dict`` (models, preprocessors, optimizers,
    schedulers, scalers), each once, and its tensor attributes by name."""
    torch: Any = require("torch")
    seen: set[int] = set()
    objects: list[Any] = []
    tensors: list[tuple[str, Any]] = []

    def add(value: Any) -> None:
        if id(value) in seen or not callable(getattr(value, "state_dict", None)):
            return
        if not callable(getattr(value, "load_state_dict", None)):
            return
        seen.add(id(value))
        objects.append(value)

    for name, value in vars(agent).items():
        if name in ("memory", "writer", "cfg", "_memfit_guard") or name.startswith("_current_"):
            continue
        if isinstance(value, torch.Tensor):
            tensors.append((name, value))
        elif isinstance(value, dict):
            for item in value.values():
                add(item)
        else:
            add(value)
    return objects, tensors


class _UpdateState:
    """What one update changes, saved before it runs and put back after an out-of-memory."""

    def __init__(self, agent: Any, rng: RngState | None) -> None:
        self.agent = agent
        self.rng = rng
        self.objects: list[Any] = []
        self.saved: list[Any] = []
        self.tensors: list[tuple[str, Any, Any]] = []
        self.tracked: dict[str, int] = {}
        self.written: dict[str, Any] = {}

    def capture(self) -> None:
        objects, tensors = _stateful(self.agent)
        self.objects = objects
        self.saved = [_to_host(obj.state_dict()) for obj in objects]
        self.tensors = [(name, t, t.detach().to("cpu", copy=True)) for name, t in tensors]
        tracking = getattr(self.agent, "tracking_data", None)
        self.tracked = {k: len(v) for k, v in tracking.items()} if tracking is not None else {}
        self.written = {}
        if self.rng is not None:
            self.rng.capture()

    def before_write(self, memory: Any, name: str) -> None:
        """Save a memory tensor the first time the update overwrites it."""
        if name not in self.written:
            self.written[name] = memory.get_tensor_by_name(name).detach().clone()

    def restore(self) -> None:
        torch: Any = require("torch")
        for obj, state in zip(self.objects, self.saved, strict=True):
            obj.load_state_dict(state)
        with torch.no_grad():
            for name, tensor, saved in self.tensors:
                # the same object (an optimizer holds it), with its values back
                tensor.copy_(saved)
                setattr(self.agent, name, tensor)
        memory: Any = getattr(self.agent, "memory", None)
        for name, saved in self.written.items():
            memory.set_tensor_by_name(name, saved)
        self.written = {}
        tracking = getattr(self.agent, "tracking_data", None)
        if tracking is not None:
            for key in list(tracking):
                keep = self.tracked.get(key, 0)
                if keep:
                    del tracking[key][keep:]
                else:
                    del tracking[key]
        if self.rng is not None:
            self.rng.restore()


class SkrlGuard:
    """The wrappers :func:`guard` installs on one skrl agent, and what they saw.

    Attributes:
        agent: The agent.
        events: Every :class:`~memfit.runtime.events.MemoryEvent` of the update guard and
            of the rollout guard, in order.
        updates: Updates that completed.
        rollout: The :class:`memfit.RolloutGuard` around ``act`` (``None`` when off).
    """

    source = "skrl"

    def __init__(
        self,
        agent: Any,
        *,
        recorder: Any | None = None,
        on_event: EventSink | None = None,
        rollout: bool = True,
        retries: int = 2,
        max_mini_batches: int | None = None,
        grow_back_after: int = 50,
        track: bool = True,
        restore_rng: bool | str = True,
    ) -> None:
        _require_agent(agent, guarded=True)
        require_object(
            "recorder",
            recorder,
            methods=("on_event",),
            what="a memfit.Recorder",
            optional=True,
        )
        require_callable("on_event", on_event, optional=True)
        require_arg("rollout", rollout, "bool")
        for name, value in (("retries", retries), ("grow_back_after", grow_back_after)):
            require_positive_int(name, value)
        if max_mini_batches is not None:
            require_positive_int(
                "max_mini_batches", max_mini_batches, hint="a whole number of mini-batches >= 1"
            )
        require_arg("track", track, "bool")
        if getattr(agent, "_memfit_guard", None) is not None:
            raise ConfigError(
                "this agent is guarded already", key_path="agent", hint="call guard() once"
            )
        self.agent = agent
        self.recorder = recorder
        self.on_event = on_event
        self.events: list[MemoryEvent] = []
        self.updates = 0
        self.retries = retries
        self.grow_back_after = grow_back_after
        self.track = track
        cfg = getattr(agent, "cfg", None)
        self._configured_mini_batches: int | None = _cfg_get(cfg, "mini_batches")
        self.max_mini_batches = max_mini_batches
        self._clean = 0
        self._state = _UpdateState(agent, rng_state(restore_rng, ()))
        self._update = agent.update
        self._post = agent.post_interaction
        self._act = agent.act
        self._timestep: int | None = None
        agent._memfit_guard = self
        agent.update = self._guarded_update
        agent.post_interaction = self._post_interaction
        self.rollout: Any | None = None
        if rollout:
            from memfit.runtime.guard import RolloutGuard

            self.rollout = RolloutGuard(
                self._act_chunk, on_event=self._sink, restore_rng=restore_rng
            )
            agent.act = self._guarded_act

    # -- events --------------------------------------------------------------------------

    def _sink(self, event: MemoryEvent) -> None:
        self.events.append(event)
        if self.recorder is not None:
            self.recorder.on_event(event)
        emit(self.on_event, event)

    def _event(self, kind: str, message: str, **data: Any) -> None:
        figures: dict[str, Any] = memory_figures()
        figures.update(data)
        step = self._timestep
        self._sink(MemoryEvent(kind=kind, step=step, source=self.source, message=message,
                               data=figures))  # fmt: skip

    # -- update --------------------------------------------------------------------------

    def _memory_write_hook(self) -> Callable[[], None]:
        """Save each memory tensor before the update's first write to it; undo the hook."""
        memory = getattr(self.agent, "memory", None)
        if memory is None or not callable(getattr(memory, "set_tensor_by_name", None)):
            return lambda: None
        original = memory.set_tensor_by_name
        state = self._state

        @functools.wraps(original)
        def set_tensor_by_name(name: str, tensor: Any) -> None:
            state.before_write(memory, name)
            original(name, tensor)

        memory.set_tensor_by_name = set_tensor_by_name

        def undo() -> None:
            if memory.__dict__.get("set_tensor_by_name") is set_tensor_by_name:
                del memory.set_tensor_by_name

        return undo

    def _can_split(self) -> int | None:
        """The next ``mini_batches`` (twice the current) when the agent has one and the
        memory holds enough transitions for it, else ``None``."""
        cfg = getattr(self.agent, "cfg", None)
        current = _cfg_get(cfg, "mini_batches")
        if not isinstance(current, int) or isinstance(current, bool):
            return None
        memory = getattr(self.agent, "memory", None)
        items = len(memory) if memory is not None else 0
        nxt = current * 2
        limit = self.max_mini_batches if self.max_mini_batches is not None else items
        return nxt if nxt <= min(limit, items) else None

    def _set_mini_batches(self, value: int) -> None:
        cfg = self.agent.cfg
        if isinstance(cfg, dict):
            cfg["mini_batches"] = value
        else:
            cfg.mini_batches = value

    def _guarded_update(self, *args: Any, **kwargs: Any) -> Any:
        self._timestep = kwargs.get("timestep", self._timestep)
        tried: list[str] = []
        failures = 0
        while True:
            self._state.capture()
            undo = self._memory_write_hook()
            message: str | None = None
            try:
                result = self._update(*args, **kwargs)
            except Exception as exc:
                if not is_oom(exc):
                    raise
                message = forget_exception(exc)
            finally:
                undo()
            if message is None:
                self.updates += 1
                self._after_clean_update()
                return result
            free_memory()
            self._state.restore()
            failures += 1
            first = message.splitlines()[0] if message else "out of memory"
            self._event("oom", "out of memory in the agent's update", error=first)
            if failures <= self.retries:
                tried.append("retry")
                self._event("retry", "update undone; running it again from the same state",
                            failures=failures)  # fmt: skip
                continue
            nxt = self._can_split()
            if nxt is not None:
                tried.append(f"mini_batches {nxt}")
                self._set_mini_batches(nxt)
                self._clean = 0
                failures = 0
                self._event("split", f"update undone; mini_batches -> {nxt} (smaller minibatches)",
                            mini_batches=nxt)  # fmt: skip
                continue
            self._event("give_up", "out of memory after " + ", ".join(tried), tried=tried)
            raise out_of_memory(
                f"out of memory in the skrl agent's update even after {', '.join(tried)}: {first}",
                tried=tried,
                hint="fewer environments or rollouts (memfit plan skrl_isaaclab_ppo), a "
                "smaller batch_size, or a larger GPU",
            )

    def _after_clean_update(self) -> None:
        configured = self._configured_mini_batches
        cfg = getattr(self.agent, "cfg", None)
        current = _cfg_get(cfg, "mini_batches")
        if not isinstance(configured, int) or not isinstance(current, int):
            return
        if current <= configured:
            return
        self._clean += 1
        if self._clean >= self.grow_back_after:
            self._clean = 0
            back = max(configured, current // 2)
            self._set_mini_batches(back)
            self._event("grow_back", f"{self.grow_back_after} clean updates: mini_batches "
                        f"{current} -> {back}", mini_batches=back, previous=current)  # fmt: skip

    # -- rollout -------------------------------------------------------------------------

    def _act_chunk(self, observations: Any, states: Any, **kwargs: Any) -> Any:
        torch: Any = require("torch")
        before = {k: v for k, v in vars(self.agent).items() if k.startswith("_current_")}
        actions, outputs = self._act(observations, states, **kwargs)
        n = int(observations.shape[0])
        kept = {
            k: v
            for k, v in vars(self.agent).items()
            if k.startswith("_current_") and v is not before.get(k)
        }

        def per_env(value: Any) -> bool:
            return isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == n

        outputs = dict(outputs or {})
        env_sized = {k: v for k, v in outputs.items() if per_env(v)}
        whole = _Whole({k: v for k, v in outputs.items() if k not in env_sized})
        kept_env = {k: v for k, v in kept.items() if per_env(v)}
        kept_whole = _Whole({k: v for k, v in kept.items() if k not in kept_env})
        return actions, env_sized, whole, kept_env, kept_whole

    def _guarded_act(self, observations: Any, states: Any = None, **kwargs: Any) -> Any:
        assert self.rollout is not None
        actions, env_sized, whole, kept_env, kept_whole = self.rollout(
            observations, states, **kwargs
        )
        for name, value in {**kept_whole.value, **kept_env}.items():
            setattr(self.agent, name, value)
        return actions, {**whole.value, **env_sized}

    # -- trainer -------------------------------------------------------------------------

    def _post_interaction(self, *args: Any, **kwargs: Any) -> Any:
        timestep = kwargs.get("timestep")
        self._timestep = timestep
        result = self._post(*args, **kwargs)
        if self.recorder is not None:
            sample = self.recorder.step(timestep if isinstance(timestep, int) else None)
            if (
                sample is not None
                and self.track
                and callable(getattr(self.agent, "track_data", None))
            ):
                for key, label in (("allocated_bytes", "Allocated"), ("reserved_bytes",
                                                                      "Reserved")):  # fmt: skip
                    value = sample.get(key)
                    if value is not None:
                        self.agent.track_data(f"Memory / {label} (MiB)", value / 2**20)
        return result

    def remove(self) -> None:
        """Take the wrappers off the agent (skrl's own methods run again)."""
        for name, original in (
            ("update", self._update),
            ("post_interaction", self._post),
            ("act", self._act),
        ):
            if name in self.agent.__dict__:
                if getattr(original, "__self__", None) is self.agent:
                    del self.agent.__dict__[name]  # skrl's own method again
                else:
                    setattr(self.agent, name, original)  # what was there before guard()
        self.agent.__dict__.pop("_memfit_guard", None)


class _Whole:
    """A chunk's values that are not per environment: every chunk's compare equal, so the
    rollout guard keeps the first."""

    __slots__ = ("value",)

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Whole)

    __hash__ = None  # type: ignore[assignment]


def guard(
    agent: Any,
    *,
    recorder: Any | None = None,
    on_event: EventSink | None = None,
    rollout: bool = True,
    retries: int = 2,
    max_mini_batches: int | None = None,
    grow_back_after: int = 50,
    track: bool = True,
    restore_rng: bool | str = True,
) -> SkrlGuard:
    """Guard an skrl agent's update and rollout, and feed a Recorder from its trainer.

    Call it after the agent is made (and before ``trainer.train()``); the trainer then
    calls the guarded methods.

    Args:
        agent: An ``skrl.agents.torch`` agent (PPO, SAC, TD3, ...).
        recorder: A :class:`memfit.Recorder`: stepped at each trainer timestep, and given
            every event.
        on_event: Called with every event as well.
        rollout: Guard ``act`` with :class:`memfit.RolloutGuard`.
        retries: Times one update is undone and run again from the same state before its
            configuration changes.
        max_mini_batches: Most ``mini_batches`` a PPO-style update may be split into
            (default: the transitions in the memory); ``retries`` failures at the largest
            give up with :class:`memfit.errors.OutOfMemory`.
        grow_back_after: Clean updates after which a raised ``mini_batches`` is halved
            again, down to the configured value.
        track: Log the Recorder's allocated/reserved MiB through skrl's ``track_data``.
        restore_rng: Put the random generators back before a retry (``True``: torch,
            NumPy, Python; ``"torch"``; ``False``).

    Returns:
        The :class:`SkrlGuard` (its ``events``, ``updates``, ``remove()``).

    Raises:
        ConfigError: When ``agent`` is not an skrl agent, is guarded already, or a number
            is out of range.
    """
    return SkrlGuard(
        agent,
        recorder=recorder,
        on_event=on_event,
        rollout=rollout,
        retries=retries,
        max_mini_batches=max_mini_batches,
        grow_back_after=grow_back_after,
        track=track,
        restore_rng=restore_rng,
    )
