"""Measured memory terms handed to the planner as plain data.

The estimators (``memfit.estimate``) trace the user's real step and reduce it to an affine
model of peak bytes over one knob; the planner (``memfit.core.plan``) uses that instead of its
analytic parameter and activation terms. This module is the plain-data meeting point, so the
core never imports an estimator.

It also holds the schema of measurements recorded in a workload file
(:class:`BraxMeasurements`: a Brax PPO job measured from its real environment and Brax's own
compiled training step), so a workload plans from measurements on a machine without Brax.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AffineLine",
    "BraxMeasurements",
    "LoopReplay",
    "MeasuredTerms",
    "Provenance",
    "StepFit",
]


@dataclass(frozen=True)
class MeasuredTerms:
    """Peak memory of a traced step as ``fixed + per_item * knob`` (bytes).

    Attributes:
        knob: The workload knob the batch dimension follows (e.g. ``"batch_size"``).
        fixed_bytes: Terms that do not grow with the knob, by name (parameters, gradients,
            optimizer state, buffers, ...), at the allocated level.
        per_item_bytes: Bytes per unit of the knob (activations and temporaries at the peak).
        residual_bytes: Largest absolute error of the affine fit over the traced points.
        source: What measured it (``"torch fake-tensor trace"``, ``"xla memory_analysis"``).
        family: The family of the band these terms take (a trace for a CUDA target:
            ``"allocated/conv"`` or ``"allocated/other"``,
            :func:`memfit.core.bands.traced_family`), or ``None`` (the basis's band).
    """

    knob: str
    fixed_bytes: dict[str, int]
    per_item_bytes: float
    residual_bytes: int = 0
    source: str = "trace"
    notes: tuple[str, ...] = field(default_factory=tuple)
    family: str | None = None

    @property
    def basis(self) -> str:
        """How these terms were obtained: ``compiled`` (XLA's ``memory_analysis``) or
        ``traced`` (a torch trace)."""
        return "compiled" if self.source.startswith("xla") else "traced"

    def peak_bytes(self, knob_value: int) -> int:
        """Predicted allocated peak at ``knob_value``."""
        return sum(self.fixed_bytes.values()) + round(self.per_item_bytes * knob_value)


# --------------------------------------------------------------------------------------------
# Brax PPO measured from the real environment and Brax's own training step


class _Record(BaseModel):
    """Strict, frozen, unknown keys refused (as every workload section)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class AffineLine(_Record):
    """``fixed + per_item * n`` bytes over one quantity ``n``, with the points it was fitted
    on (``[n, bytes]`` pairs, as compiled) and the largest error of the fit over them.

    Attributes:
        fixed_bytes: The intercept (may be negative: XLA reuses buffers).
        per_item_bytes: Bytes per unit of ``n``.
        points: The measured ``[n, bytes]`` pairs.
        residual_bytes: Largest absolute error of the line over ``points``.
    """

    fixed_bytes: float
    per_item_bytes: float
    points: list[list[int]] = Field(default_factory=list)
    residual_bytes: int = 0

    def at(self, n: int) -> int:
        """The line at ``n`` (bytes, never below zero)."""
        return max(0, round(self.fixed_bytes + self.per_item_bytes * n))


class StepFit(_Record):
    """Brax's training step, compiled: the bytes besides the training state and the env
    state, as ``fixed + per_transition * B*M*U + per_minibatch_item * B*U``.

    ``B*M*U`` (``batch_size * num_minibatches * unroll_length``) counts the transitions one
    training step collects (the rollout and the copies ``sgd_step`` permutes); ``B*U`` the
    items of one minibatch (its gathered data, the activations and their gradients). The
    three coefficients are solved from three compiled points that vary those two counts
    independently (``points``: ``{num_envs, batch_size, num_minibatches, unroll_length,
    bytes}``).
    """

    fixed_bytes: float
    per_transition_bytes: float
    per_minibatch_item_bytes: float
    points: list[dict[str, int]] = Field(default_factory=list)

    def at(self, transitions: int, minibatch_items: int) -> int:
        """The step's bytes at these counts (never below zero)."""
        value = (
            self.fixed_bytes
            + self.per_transition_bytes * transitions
            + self.per_minibatch_item_bytes * minibatch_items
        )
        return max(0, round(value))


class Provenance(_Record):
    """Where a recorded measurement comes from.

    Attributes:
        versions: Package versions it was taken with (``brax``, ``jax``, ``jaxlib``).
        platform: What XLA compiled for: its backend (``cpu``, ``gpu``) or, compiled by XLA's
            GPU compiler for a named card, ``"cuda sm_89 (NVIDIA GeForce RTX 4070)"``.
        date: When (ISO date).
        command: The command that took it (so anyone can take it again).
        machine: Where, in words.
        seconds: How long the measurement took.
    """

    versions: dict[str, str]
    platform: str
    date: str
    command: str
    machine: str | None = None
    seconds: float | None = None


#: Brax's evaluator's environments (``ppo.train``'s ``num_eval_envs`` default).
NUM_EVAL_ENVS = 128

#: Training epochs (with an evaluation after each) replayed. Brax's loop is the same call
#: pattern every epoch (both states donated), so the replayed peak settles by the second
#: epoch (checked in tests/core/test_brax_loop_replay.py against 30 epochs, pooled and grown
#: on demand); a third is kept for margin.
LOOP_ITERATIONS = 3


@dataclass(frozen=True)
class LoopReplay:
    """Brax's training loop replayed through the BFC allocator model (bytes, per device).

    Attributes:
        peak_bytes_in_use: What ``memory_stats()["peak_bytes_in_use"]`` would show.
        live_peak_bytes: The most the arrays (rounded to 256 B) need at once.
        peak_at: Where the peak was reached (``"iteration 1, training epoch"``).
        iterations: Epochs replayed, each followed by an evaluation.
        num_eval_envs: The evaluator's environments.
    """

    peak_bytes_in_use: int
    live_peak_bytes: int
    peak_at: str
    iterations: int
    num_eval_envs: int


class BraxMeasurements(_Record):
    """A Brax PPO workload measured from its real environment and Brax's own training step.

    Written by :func:`memfit.integrations.brax.measure_ppo` (into the cache, or into a
    workload's ``measurements:`` section with its provenance); read by the ``ppo`` family
    (:mod:`memfit.core.families.ppo`), which then uses these terms instead of its analytic
    ones:

    * ``training_state``: ``training_state_bytes`` (parameters, Adam's two states and the
      observation normaliser, as Brax's ``TrainingState`` holds them);
    * ``env_state``: ``num_envs x env_state_bytes``, the state as ``ppo.train`` holds it (after
      Brax's training wrappers, which keep the first state for automatic resets: about twice
      ``jax.eval_shape(env.reset)``, kept as ``env_state_raw_bytes``);
    * ``rollout_buffer``: ``batch_size x num_minibatches x unroll_length x transition_bytes``;
    * ``env_step_temporaries``: ``env_step`` at ``num_envs`` (XLA's temporaries of the vmapped
      ``env.step``, compiled at two sizes);
    * ``sgd_temporaries``: what the SGD phase of the compiled training step needs beyond the
      rollout and the env step's scratch, which XLA reuses for it (``step`` less those two,
      never below zero): so the sum is the larger of the two phases.

    Attributes:
        env: The environment (``brax:humanoid``).
        backend: Its physics pipeline (``mjx``, ``generalized``, ``positional``, ``spring``).
        config: What else decides the measurement (network widths, ``num_updates_per_batch``,
            ...), as it was measured.
        provenance: Versions, platform, date and command.
    """

    env: str
    backend: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    provenance: Provenance
    env_state_bytes: int = Field(ge=0)
    env_state_raw_bytes: int | None = Field(default=None, ge=0)
    transition_bytes: int = Field(ge=0)
    training_state_bytes: int = Field(ge=0)
    env_step: AffineLine
    step: StepFit

    def terms(self, values: Mapping[str, int], device_count: int = 1) -> list[tuple[str, int]]:
        """The measured terms at these knob values, per device (``pmap`` splits the
        environments and the trajectories over ``device_count`` devices).

        >>> m = BraxMeasurements(env="brax:x", provenance=Provenance(versions={}, platform="cpu",
        ...     date="2026-01-01", command="test"), env_state_bytes=100, transition_bytes=10,
        ...     training_state_bytes=1000, env_step=AffineLine(fixed_bytes=0, per_item_bytes=50),
        ...     step=StepFit(fixed_bytes=0, per_transition_bytes=30, per_minibatch_item_bytes=5))
        >>> dict(m.terms({"num_envs": 8, "batch_size": 4, "num_minibatches": 2,
        ...               "unroll_length": 5}))["sgd_temporaries"]
        500
        """
        envs = values["num_envs"] // device_count
        trajectories = values["batch_size"] * values["num_minibatches"] // device_count
        transitions = trajectories * values["unroll_length"]
        minibatch_items = values["batch_size"] // device_count * values["unroll_length"]
        rollout = transitions * self.transition_bytes
        env_step = self.env_step.at(envs)
        sgd = self.step.at(transitions, minibatch_items)
        return [
            ("training_state", self.training_state_bytes),
            ("env_state", envs * self.env_state_bytes),
            ("rollout_buffer", rollout),
            ("env_step_temporaries", env_step),
            ("sgd_temporaries", max(0, sgd - rollout - env_step)),
        ]

    #: How each term of :meth:`terms` and :meth:`loop_terms` is obtained, for a plan's
    #: per-term basis: ``"compiled"`` (XLA's memory analysis of Brax's own compiled step or
    #: env step, fitted over the measured settings), ``"traced"`` (``jax.eval_shape`` of the
    #: real env and training state) or ``"replayed"`` (Brax's training loop replayed through
    #: the BFC allocator model, :meth:`replay_loop`).
    BASIS: ClassVar[dict[str, str]] = {
        "training_state": "traced",
        "env_state": "traced",
        "rollout_buffer": "traced",
        "env_step_temporaries": "compiled",
        "sgd_temporaries": "compiled",
        "eval_env_state": "traced",
        "allocator_loop": "replayed",
    }

    def replay_loop(
        self,
        values: Mapping[str, int],
        device_count: int = 1,
        *,
        preallocate: bool = True,
        num_eval_envs: int = NUM_EVAL_ENVS,
        iterations: int = LOOP_ITERATIONS,
    ) -> LoopReplay:
        """Brax's ``ppo.train`` loop replayed through JAX's BFC allocator
        (:class:`memfit.allocator.bfc.BfcAllocator`) at these knob values, per device.

        Held from the start: the training state, the env state and the evaluator's env state
        (``num_eval_envs`` envs; Brax donates both states to each call, so the calls reuse
        their buffers). Then, ``iterations`` times, as ``train`` runs them: a training epoch
        (its metrics, then its temporaries: the rollout, the env step's and the SGD phase's
        scratch, one allocation freed when it returns; the last epoch's metrics dropped) and
        an evaluation (its metrics, then its temporaries: the env step at ``num_eval_envs``).
        A chunk freed earlier and under twice a later request is handed out whole, so
        ``peak_bytes_in_use`` may be above what the arrays need at any moment.

        >>> m = BraxMeasurements(env="brax:x", provenance=Provenance(versions={}, platform="cpu",
        ...     date="2026-01-01", command="test"), env_state_bytes=1000, transition_bytes=10,
        ...     training_state_bytes=1 << 20, env_step=AffineLine(fixed_bytes=0, per_item_bytes=50),
        ...     step=StepFit(fixed_bytes=0, per_transition_bytes=30, per_minibatch_item_bytes=5))
        >>> r = m.replay_loop({"num_envs": 2048, "batch_size": 256, "num_minibatches": 8,
        ...                    "unroll_length": 10})
        >>> r.peak_bytes_in_use >= r.live_peak_bytes > (1 << 20) + 2048 * 1000
        True
        """
        from memfit.allocator.bfc import BfcAllocator, round_up

        terms = dict(self.terms(values, device_count))
        envs = values["num_envs"] // device_count
        epoch_temp = (
            terms["rollout_buffer"] + terms["env_step_temporaries"] + terms["sgd_temporaries"]
        )
        eval_temp = self.env_step.at(num_eval_envs)
        metrics = 256  # a few float32 means per call
        pool = BfcAllocator(1 << 50, preallocate=preallocate)  # the plan checks the budget
        live = 0
        live_peak = 0
        for size in (self.training_state_bytes, envs * self.env_state_bytes,
                     num_eval_envs * self.env_state_bytes):  # fmt: skip
            pool.allocate(size)
            live += round_up(max(size, 1))
        held_metrics: list[int] = []
        peak_at = "start"
        peak = pool.peak_bytes_in_use
        for iteration in range(1, iterations + 1):
            for phase, temp in (("training epoch", epoch_temp), ("evaluation", eval_temp)):
                out = pool.allocate(metrics)
                scratch = pool.allocate(temp) if temp > 0 else None
                now = live + round_up(metrics) + (round_up(temp) if temp > 0 else 0)
                live_peak = max(live_peak, now)
                if pool.peak_bytes_in_use > peak:
                    peak, peak_at = pool.peak_bytes_in_use, f"iteration {iteration}, {phase}"
                if scratch is not None:
                    pool.free(scratch)
                for old in held_metrics:
                    pool.free(old)
                held_metrics = [out]
        return LoopReplay(
            peak_bytes_in_use=peak,
            live_peak_bytes=max(live_peak, live),
            peak_at=peak_at,
            iterations=iterations,
            num_eval_envs=num_eval_envs,
        )

    def loop_terms(
        self,
        values: Mapping[str, int],
        device_count: int = 1,
        *,
        preallocate: bool = True,
    ) -> list[tuple[str, int]]:
        """:meth:`terms` and what Brax's loop adds (:meth:`replay_loop`): the evaluator's
        env state, and ``allocator_loop``, what the replay's ``peak_bytes_in_use`` is above
        the sum of the other terms (chunks handed out whole, the metrics, 256-byte rounding;
        never below zero), so the terms sum to the replayed peak."""
        terms = self.terms(values, device_count)
        replay = self.replay_loop(values, device_count, preallocate=preallocate)
        eval_state = replay.num_eval_envs * self.env_state_bytes
        listed = sum(n for _, n in terms) + eval_state
        return [
            *terms,
            ("eval_env_state", eval_state),
            ("allocator_loop", max(0, replay.peak_bytes_in_use - listed)),
        ]
