"""Every public function and class of memfit checks its arguments (issue 21): a value of the
wrong type for any parameter is a ``ConfigError`` naming the parameter, never a
``TypeError``, ``AttributeError`` or a failure later, at the first step."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

import memfit
from memfit.errors import ConfigError

torch = pytest.importorskip("torch", reason="the guards need torch")


class _Wrong:
    """A value of no type any memfit parameter accepts."""

    def __repr__(self) -> str:
        return "<wrong>"


WRONG = _Wrong()


def _optimizer() -> Any:
    return torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)


def _loss(batch: Any) -> Any:
    return batch.sum()


def _snapshot() -> Any:
    from memfit.allocator.snapshot_build import TraceBuilder

    builder = TraceBuilder()
    for _ in range(3):
        builder.malloc(8 * 2**20)
    return builder.snapshot()


def _device() -> Any:
    from memfit.backends import SimulatedDevice

    return SimulatedDevice("8GiB", name="NVIDIA GeForce RTX 4060 Ti")


# name -> (callable, the required arguments, valid)
CASES: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "autoconfig": (memfit.autoconfig, {"workload": "act_dual_camera"}),
    "check": (memfit.check, {"workload": "act_dual_camera"}),
    "clip_grad_norm": (memfit.clip_grad_norm, {"max_norm": 1.0}),
    "configure": (memfit.configure, {"environ": {}}),
    "estimate_jax": (memfit.estimate_jax, {"fn": lambda x: x}),
    "estimate_torch": (
        memfit.estimate_torch,
        {
            "build": lambda: (None, None),
            "step": lambda m, o, b: None,
            "make_batch": lambda n: None,
            "batch_sizes": [1, 2, 4],
        },
    ),
    "fit": (memfit.fit, {"run": lambda n: None, "low": 1, "high": 8, "budget": "1GiB"}),
    "format_bytes": (memfit.format_bytes, {"n": 1}),
    "gpu": (memfit.gpu, {"name_or_size": "A100-80GB"}),
    "is_oom": (memfit.is_oom, {"exc": RuntimeError("x")}),
    "list_gpus": (memfit.list_gpus, {}),
    "load_workload": (memfit.load_workload, {"ref": "act_dual_camera"}),
    "parse_bytes": (memfit.parse_bytes, {"text": "1GiB"}),
    "plan": (memfit.plan, {"workload": "act_dual_camera", "gpu": "A100-80GB"}),
    "plan_devices": (
        memfit.plan_devices,
        {"workload": "dqn_fire_raster@ddp", "gpu": "4xA100-80GB"},
    ),
    "simulate_gpu": (memfit.simulate_gpu, {"budget": "1GiB"}),
    "measure_simulator": (
        memfit.measure_simulator,
        {"make_env": lambda point: None, "probe": _device(), "store": False},
    ),
    "TrainGuard": (memfit.TrainGuard, {"optimizer": _optimizer(), "loss_fn": _loss}),
    "RolloutGuard": (memfit.RolloutGuard, {"fn": lambda x: x}),
    "Recorder": (memfit.Recorder, {"log": False}),
    "cleanup.every": (memfit.cleanup.every, {"n": 10}),
    "cleanup.on_pressure": (memfit.cleanup.on_pressure, {}),
    "cleanup.full_reset": (memfit.cleanup.full_reset, {}),
    "cleanup.after_call": (memfit.cleanup.after_call, {}),
    "testing.inject_oom": (memfit.testing.inject_oom, {"rate": 0.0}),
    "explain": (memfit.explain, {"snapshot": _snapshot()}),
}

#: Parameters that take any object by design.
ANY = {("estimate_jax", "args"), ("estimate_jax", "kwargs"), ("fit", "prior")}


def _params() -> list[tuple[str, str]]:
    out = []
    for name, (fn, _) in CASES.items():
        for param in inspect.signature(fn).parameters.values():
            if (name, param.name) in ANY or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            out.append((name, param.name))
    return out


def test_every_public_callable_is_covered() -> None:
    names = {
        n
        for n in memfit.__all__
        if (callable(getattr(memfit, n)) and not inspect.isclass(getattr(memfit, n)))
        or n in ("TrainGuard", "RolloutGuard", "Recorder")
    }
    assert names <= set(CASES), names - set(CASES)


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    result = fn(**kwargs)
    if hasattr(result, "__enter__"):  # a context manager checks on entering
        with result:
            pass


@pytest.mark.parametrize(("name", "param"), _params())
def test_a_wrong_type_is_a_config_error_naming_the_argument(name: str, param: str) -> None:
    fn, required = CASES[name]
    kwargs = {**required, param: WRONG}
    with pytest.raises(ConfigError) as info:
        _call(fn, kwargs)
    assert param in (info.value.key_path or "") or param in str(info.value), str(info.value)


#: Parameters that take an integer of any size by design (a random seed), and the unit
#: parser and formatter (their own bound, 16 EiB, and message: tests/test_units_bounds.py).
ANY_INT = {("testing.inject_oom", "seed"), ("format_bytes", "n"), ("parse_bytes", "text")}


@pytest.mark.parametrize(("name", "param"), _params())
@pytest.mark.parametrize("huge", [2**64 + 1, -(2**63), 10**40], ids=["2**64+1", "-2**63", "10**40"])
def test_an_integer_no_count_or_size_can_be_is_a_config_error(
    name: str, param: str, huge: int
) -> None:
    """Issue 45: ``explain(max_bytes=2**63)`` was an ``OverflowError``. Every parameter of
    every public callable refuses an integer no count or size can be (a count: 2**63 or
    more in magnitude; a size: negative or over 16 EiB; any other kind refuses an int),
    naming the parameter."""
    if (name, param) in ANY_INT:
        pytest.skip("takes any integer")
    fn, required = CASES[name]
    with pytest.raises(ConfigError) as info:
        _call(fn, {**required, param: huge})
    assert param in (info.value.key_path or "") or param in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda: memfit.plan("act_dual_camera", "A100-80GB", overrides=["k=5"]), "overrides"),
        (lambda: memfit.check("act_dual_camera", "k=5"), "overrides"),  # type: ignore[arg-type]
        (lambda: memfit.TrainGuard(_optimizer(), _loss, model="m"), "model"),  # type: ignore[arg-type]
        (lambda: memfit.TrainGuard(_optimizer(), _loss, scaler=5), "scaler"),  # type: ignore[arg-type]
        (lambda: memfit.Recorder(5), "path"),  # type: ignore[arg-type]
        (lambda: memfit.testing.inject_oom(0.0, at="abc").__enter__(), "at"),  # type: ignore[arg-type]
        (lambda: memfit.testing.inject_oom(0.0, limit=1.5).__enter__(), "limit"),  # type: ignore[arg-type]
    ],
)
def test_the_cases_of_the_issue(call: Callable[[], Any], param: str) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.key_path == param


def test_a_count_fn_that_returns_a_negative_count_fails_at_the_first_step() -> None:
    model = torch.nn.Linear(2, 1)
    guard = memfit.TrainGuard(
        torch.optim.SGD(model.parameters(), lr=0.1),
        lambda b: model(b).mean(),
        count_fn=lambda b: -3.0,
    )
    with pytest.raises(ConfigError, match="count_fn"):
        guard(torch.ones(4, 2))


# --- every public function of every integration (issue 34) ------------------------------------

#: The integration modules and the library each one's valid arguments need.
INTEGRATIONS: dict[str, str] = {
    "brax": "brax",
    "gymnasium": "gymnasium",
    "isaaclab": "torch",
    "lightning": "lightning.pytorch",
    "optuna": "optuna",
    "prometheus": "prometheus_client",
    "ray": "ray.tune",
    "skrl": "torch",
    "transformers": "transformers",
}

#: Records memfit returns (built from checked data, never from a user's arguments).
RECORDS = {"brax.PpoViolation", "ray.EventLog"}

#: Parameters that take any object by design (the event's ids Isaac Lab passes; the env a
#: cleanup event keeps its policy on).
INTEGRATION_ANY = {
    ("isaaclab.backends", "env"),
    ("isaaclab.cleanup_event", "env"),
    ("isaaclab.cleanup_event", "env_ids"),
    ("lightning.in_batch_size_trial", "trainer"),
}

WORKLOAD = "dqn_fire_raster@device_replay"
SMALL_GPU = "3.68GiB"


class _Agent:
    """What memfit needs of an skrl agent: ``act``, ``update`` and a config."""

    def __init__(self) -> None:
        self.cfg = {"rollouts": 8, "mini_batches": 2}
        self.memory = None

    def act(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def update(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def post_interaction(self, *args: Any, **kwargs: Any) -> Any:
        return None


def _trial() -> Any:
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="maximize").ask()


@functools.cache
def _plan() -> Any:
    return memfit.plan("dqn_fire_raster", gpu="4GB")


@functools.cache
def _violation() -> Any:
    return memfit.check("dqn_fire_raster", {"buffer_size": 10_005})[0]


@functools.cache
def _brax_env() -> Any:
    envs = pytest.importorskip("brax.envs")
    return envs.get_environment("fast")


def _pl_module() -> Any:
    pl = pytest.importorskip("lightning.pytorch")

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 1)
            self.automatic_optimization = False

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Tiny()
    module.optimizers = lambda: torch.optim.SGD(module.parameters(), lr=0.1)
    return module


def _training_args(tmp: str = "memfit-test-out") -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.TrainingArguments(output_dir=tmp, per_device_train_batch_size=8)


def _simulated_device() -> Any:
    from memfit.backends.simulated import SimulatedDevice

    return SimulatedDevice(8 * 2**30)


def _ppo_args() -> dict[str, Any]:
    return {
        "num_envs": 2048,
        "batch_size": 1024,
        "num_minibatches": 32,
        "unroll_length": 10,
        "episode_length": 1000,
        "local_device_count": 1,
        "process_count": 1,
    }


def _gym_env() -> Any:
    return pytest.importorskip("gymnasium").make("CartPole-v1")


def _cards() -> list[str]:
    return ["RTX 4090"]


@functools.cache
def _knobs() -> dict[str, Any]:
    from memfit.integrations.ray import feasible_configs

    return feasible_configs(WORKLOAD, _cards())[0]


@functools.cache
def _estimate() -> Any:
    return memfit.estimate_torch(
        lambda: (torch.nn.Linear(4, 4), None),
        lambda m, o, b: m(b).sum().backward(),
        lambda n: torch.ones(n, 4),
        batch_sizes=[1, 2],
    )


# "module.name" -> the valid arguments a call needs (made when the case runs)
INTEGRATION_CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "brax.check_ppo": _ppo_args,
    "brax.ppo_violations": _ppo_args,
    "brax.describe": lambda: {"violation": _violation()},
    "brax.ensure_jax_compat": dict,
    "brax.jax_allocator_settings": lambda: {"plan": _plan(), "total_bytes": 4 * 2**30},
    "brax.measure_ppo": lambda: {"env": _brax_env()},
    "brax.plan_ppo": lambda: {"env": _brax_env(), "gpu": "RTX 4070"},
    "brax.ppo_kwargs": lambda: {"plan": _plan()},
    "brax.ppo_workload": lambda: {"observation_size": 8, "action_size": 2, "env_state_bytes": 64},
    "brax.resolve_measurements": lambda: {
        "workload": memfit.load_workload("brax_humanoid_ppo@quick"),
        "mode": "recorded",
    },
    "brax.train": lambda: {"environment": _brax_env()},
    "gymnasium.MemoryWrapper": lambda: {"env": _gym_env()},
    "gymnasium.guard_mode": lambda: {"env": _gym_env()},
    "gymnasium.wrapper_class": dict,
    "isaaclab.autoconfig": lambda: {
        "env": SimpleNamespace(num_envs=4, device="cpu"),
        "workload": "act_dual_camera",
    },
    "isaaclab.backends": lambda: {"env": SimpleNamespace()},
    "isaaclab.cleanup_event": lambda: {"env": SimpleNamespace(), "env_ids": None},
    "isaaclab.guarded_term": lambda: {"term": lambda env: torch.zeros(2)},
    "isaaclab.isaac_versions": dict,
    "isaaclab.measure": lambda: {
        "make_env": lambda point: None,
        "probe": _device(),
        "store": False,
    },
    "lightning.LightningGuard": lambda: {
        "pl_module": _pl_module(),
        "train_guard": memfit.TrainGuard(_optimizer(), _loss),
        "accumulate": 1,
    },
    "lightning.MemfitCallback": dict,
    "lightning.batch_size_from_estimate": lambda: {"estimate": _estimate(), "budget": "1GiB"},
    "lightning.callback_class": dict,
    "lightning.guard": lambda: {"pl_module": _pl_module(), "loss_fn": _loss},
    "lightning.in_batch_size_trial": lambda: {"trainer": SimpleNamespace()},
    "lightning.keep_effective_batch": lambda: {"effective": 64, "micro": 16},
    "optuna.knobs": lambda: {"trial": _trial()},
    "optuna.objective": lambda: {"fn": lambda trial: 0.0},
    "optuna.position_to_index": lambda: {"position": 1, "positions": 5, "options": 3},
    "optuna.pruned_on_oom": lambda: {"trial": _trial()},
    "optuna.space": lambda: {"workload": WORKLOAD, "gpu": SMALL_GPU},
    "optuna.suggest": lambda: {"trial": _trial(), "workload": WORKLOAD, "gpu": SMALL_GPU},
    "prometheus.PrometheusSink": dict,
    "prometheus.parse_address": lambda: {"address": ":0"},
    "ray.Card": lambda: {"gpu": "A100"},
    "ray.Request": lambda: {"gpu": 0.5, "cpu": 1.0, "labels": (), "peak_bytes": 2**30},
    "ray.feasible_configs": lambda: {"workload": WORKLOAD, "cards": _cards()},
    "ray.fits_some": lambda: {"workload": WORKLOAD, "cards": _cards()},
    "ray.metrics": dict,
    "ray.param_space": lambda: {"workload": WORKLOAD, "cards": _cards()},
    "ray.request_for": lambda: {"knobs": _knobs(), "workload": WORKLOAD, "cards": _cards()},
    "ray.resources": lambda: {"workload": WORKLOAD, "cards": _cards()},
    "ray.trial_autoconfig": lambda: {"workload": WORKLOAD, "probe": _simulated_device()},
    "skrl.SkrlGuard": lambda: {"agent": _Agent()},
    "skrl.apply_knobs": lambda: {"cfg": {"rollouts": 16}, "knobs": {"rollouts": 32}},
    "skrl.autoconfig": lambda: {"cfg": {"rollouts": 16}, "workload": "skrl_isaaclab_ppo"},
    "skrl.guard": lambda: {"agent": _Agent()},
    "skrl.knobs_of": dict,
    "transformers.MemfitCallback": dict,
    "transformers.apply_batch": lambda: {"args": _training_args(), "micro_batch": 4},
    "transformers.batch_size_from_estimate": lambda: {"estimate": _estimate(), "budget": "1GiB"},
    "transformers.callback_class": dict,
    "transformers.keep_effective_batch": lambda: {"effective": 64, "micro": 16},
    "transformers.train": lambda: {
        "trainer": SimpleNamespace(
            train=lambda **kw: None,
            args=_training_args(),
            model=torch.nn.Linear(2, 1),
            optimizer=None,
            lr_scheduler=None,
        ),
    },
}


def _integration_module(short: str) -> Any:
    return importlib.import_module(f"memfit.integrations.{short}")


def _integration_callables() -> set[str]:
    found = set()
    for short in INTEGRATIONS:
        module = _integration_module(short)
        for name in module.__all__:
            if callable(getattr(module, name)):
                found.add(f"{short}.{name}")
    return found - RECORDS


def test_every_public_callable_of_every_integration_is_covered() -> None:
    found = _integration_callables()
    assert found == set(INTEGRATION_CASES), found ^ set(INTEGRATION_CASES)


def _integration_params() -> list[tuple[str, str]]:
    out = []
    for name in sorted(INTEGRATION_CASES):
        short, _, attr = name.partition(".")
        fn = getattr(_integration_module(short), attr)
        for param in inspect.signature(fn).parameters.values():
            if (name, param.name) in INTEGRATION_ANY or param.kind in (
                param.VAR_POSITIONAL,
                param.VAR_KEYWORD,
            ):
                continue
            out.append((name, param.name))
    return out


@pytest.mark.parametrize(("name", "param"), _integration_params())
def test_an_integration_refuses_a_wrong_type_naming_the_argument(name: str, param: str) -> None:
    short, _, attr = name.partition(".")
    pytest.importorskip(INTEGRATIONS[short])
    fn = getattr(_integration_module(short), attr)
    kwargs = {**INTEGRATION_CASES[name](), param: WRONG}
    with pytest.raises(ConfigError) as info:
        _call(fn, kwargs)
    assert param in (info.value.key_path or "") or param in str(info.value), str(info.value)


def test_a_text_size_for_host_memory_is_read_as_a_size() -> None:
    as_text = memfit.plan("dqn_fire_raster", gpu="4GB", host_memory_bytes="16GiB")
    as_int = memfit.plan("dqn_fire_raster", gpu="4GB", host_memory_bytes=16 * 2**30)
    assert as_text.knobs == as_int.knobs and as_text.host_bytes == as_int.host_bytes


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda: memfit.format_bytes(1, precision=-1), "precision"),
        (lambda: memfit.GpuSpec("mine", -1, "ampere", None, "by hand"), "total_bytes"),
        (lambda: memfit.GpuSpec("mine", "8GB", "ampere", None, "by hand"), "total_bytes"),  # type: ignore[arg-type]
        (lambda: memfit.GpuSpec("mine", 2**30, "ampere", (8,), "by hand"), "compute_capability"),
        (lambda: memfit.estimate_jax(lambda x: x, 1, batch_size=-5), "batch_size"),
        (
            lambda: memfit.plan("dqn_fire_raster", gpu="4GB", host_memory_bytes="16 parsecs"),
            "host_memory_bytes",
        ),
    ],
)
def test_the_cases_of_the_issue_round_3(call: Callable[[], Any], param: str) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.key_path == param, str(info.value)


class _Odd:
    """A value whose ``__str__`` and ``__iter__`` fail (what a framework may hand over)."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __iter__(self) -> Any:
        yield "retry"
        raise RuntimeError("broken generator")


def test_an_out_of_memory_error_is_built_whatever_it_is_given() -> None:
    """An exception's constructor never raises: odd input from the framework is kept as
    well as it can be, never a ConfigError that hides the out-of-memory."""
    np = pytest.importorskip("numpy")
    odd = memfit.OutOfMemory(
        "x",
        tried=5,  # type: ignore[arg-type]
        peak_bytes="1GB",  # type: ignore[arg-type]
        free_bytes=np.int64(4096),  # type: ignore[arg-type]
        requested_bytes=True,  # type: ignore[arg-type]
        device=0,  # type: ignore[arg-type]
    )
    assert odd.tried == ["5"] and odd.peak_bytes is None and odd.requested_bytes is None
    assert odd.free_bytes == 4096 and type(odd.free_bytes) is int and odd.device == "0"
    assert memfit.OutOfMemory("x", tried="retry").tried == ["retry"]
    broken = memfit.OutOfMemory("x", tried=_Odd(), device=_Odd())  # type: ignore[arg-type]
    assert broken.tried == ["retry"] and broken.device is None
    assert memfit.OutOfMemory("x", tried=[_Odd(), b"split"]).tried == ["?", "split"]  # type: ignore[list-item]
    assert "x" in str(odd) and odd.to_dict()["tried"] == ["5"]


@pytest.mark.parametrize(
    "jaxlib", ["9" * 5000 + ".1", "\u0660.\u0664", "1234567890.1", "0.4.33" + "9" * 5000, ""]
)
def test_a_jaxlib_that_is_no_version_is_refused_before_anything_runs(jaxlib: str) -> None:
    """Issue 45: ``jaxlib='9' * 5000 + '.1'`` was a raw ``ValueError`` (Python's 4,300-digit
    limit) from the version parser, before the argument check said anything."""
    with pytest.raises(ConfigError) as info:
        memfit.estimate_jax(lambda x: x, 1.0, gpu="RTX 4090", jaxlib=jaxlib)
    assert info.value.key_path == "jaxlib" and len(str(info.value)) < 200


class _Trial:
    """A trial whose sampler answers ``answer`` (an Optuna trial gone wrong)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.user_attrs: dict[str, Any] = {}

    def suggest_int(self, name: str, low: int, high: int) -> Any:
        return self.answer

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"trial": None}, "trial"),
        ({"trial": object()}, "trial"),
        ({"trial": _Trial(0), "fixed": [("buffer_size", 10000)]}, "fixed"),
        ({"trial": _Trial(0), "fixed": {"buffer_size": [1]}}, "fixed.buffer_size"),
        ({"trial": _Trial(10**30)}, "trial"),
        ({"trial": _Trial(-1)}, "trial"),
        ({"trial": _Trial("3")}, "trial"),
        ({"trial": _Trial(0), "host_memory_bytes": "lots"}, "host_memory_bytes"),
    ],
)
def test_optuna_suggest_refuses_what_is_not_a_trial_or_a_pin(
    kwargs: dict[str, Any], param: str
) -> None:
    from memfit.integrations.optuna import suggest

    with pytest.raises(ConfigError) as info:
        suggest(workload=WORKLOAD, gpu=SMALL_GPU, **kwargs)
    assert info.value.key_path == param, str(info.value)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda r: r.request_for(_knobs(), WORKLOAD, _cards(), cpu="two"), "cpu"),
        (lambda r: r.request_for(_knobs(), WORKLOAD, _cards(), cpu=0), "cpu"),
        (lambda r: r.request_for(None, WORKLOAD, _cards()), "knobs"),
        (lambda r: r.feasible_configs(WORKLOAD, None), "cards"),
        (lambda r: r.feasible_configs(WORKLOAD, "RTX 4090"), "cards"),
        (lambda r: r.feasible_configs(WORKLOAD, [None]), "cards[0]"),
        (lambda r: r.param_space(WORKLOAD, 5), "cards"),
        (lambda r: r.resources(WORKLOAD, _cards(), cpu="two"), "cpu"),
        (lambda r: r.trial_autoconfig(WORKLOAD, share="half"), "share"),
        (lambda r: r.metrics(["oom"]), "events[0]"),
        (lambda r: r.fits_some(WORKLOAD, _cards())(5), "knobs"),
    ],
)
def test_ray_refuses_what_is_not_a_card_a_share_or_a_cpu_count(
    call: Callable[[Any], Any], param: str
) -> None:
    from memfit.integrations import ray

    with pytest.raises(ConfigError) as info:
        call(ray)
    assert info.value.key_path == param, str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"max_mini_batches": -2}, "max_mini_batches"),
        ({"max_mini_batches": "8"}, "max_mini_batches"),
        ({"on_event": "print"}, "on_event"),
        ({"recorder": 5}, "recorder"),
    ],
)
def test_skrl_guard_refuses_bad_options(kwargs: dict[str, Any], param: str) -> None:
    from memfit.integrations import skrl

    with pytest.raises(ConfigError) as info:
        skrl.guard(_Agent(), **kwargs)
    assert info.value.key_path == param
    with pytest.raises(ConfigError, match="skrl agent") as info:
        skrl.guard(object())
    assert info.value.key_path == "agent"
    with pytest.raises(ConfigError) as info:
        skrl.apply_knobs({"rollouts": 16}, {"rollouts": "many"})
    assert info.value.key_path == "knobs.rollouts"
    with pytest.raises(ConfigError) as info:
        skrl.apply_knobs("PPO", {})
    assert info.value.key_path == "cfg"


class _NoPostInteraction:
    cfg: ClassVar[dict[str, int]] = {"rollouts": 8}

    def act(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def update(self, *args: Any, **kwargs: Any) -> Any:
        return None


class _SlottedAgent:
    __slots__ = ()
    cfg: ClassVar[dict[str, int]] = {"rollouts": 8}

    def act(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def update(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def post_interaction(self, *args: Any, **kwargs: Any) -> Any:
        return None


@pytest.mark.parametrize(
    ("agent", "words"),
    [(_NoPostInteraction(), "post_interaction"), (_SlottedAgent(), "__slots__")],
)
@pytest.mark.parametrize("make", ["guard", "SkrlGuard"])
def test_skrl_guard_refuses_an_agent_it_cannot_wrap(agent: Any, words: str, make: str) -> None:
    """Issue 45: an agent without ``post_interaction``, or whose class has ``__slots__``,
    was a raw ``AttributeError`` from the guard."""
    from memfit.integrations import skrl

    with pytest.raises(ConfigError, match=words) as info:
        getattr(skrl, make)(agent)
    assert info.value.key_path == "agent" and info.value.hint
    assert skrl.knobs_of(agent) is not None  # reading its config needs no wrapping


def test_prometheus_sink_refuses_a_registry_that_is_not_one() -> None:
    pytest.importorskip("prometheus_client")
    from memfit.integrations.prometheus import PrometheusSink

    with pytest.raises(ConfigError) as info:
        PrometheusSink(registry=5)
    assert info.value.key_path == "registry"
    with pytest.raises(ConfigError) as info:
        PrometheusSink(10**5000)
    assert info.value.key_path == "address"


# --- the loop replay, memfit.estimate.xla.program (issue 45) ------------------------------------


def _phases() -> dict[str, Any]:
    from memfit.estimate.xla.program import PhaseBuffers

    return {"step": PhaseBuffers("step", ((4096, 256), (8,)), temp_bytes=2**20)}


def _loop() -> list[Any]:
    from memfit.estimate.xla import program as jp

    return [
        jp.Allocate("key", (8,)),
        jp.Call("step", ("state_new", "loss")),
        jp.Rebind("state", "state_new"),
        jp.Release("loss"),
        jp.Release("key"),
    ]


def _replay_args() -> dict[str, Any]:
    return {
        "initial": {"state": [4096, 256]},
        "phases": _phases(),
        "loop": _loop(),
        "limit_bytes": 2**30,
    }


# "name" -> the valid arguments a call needs
JAX_PROGRAM_CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "replay_program": _replay_args,
    "PhaseBuffers": lambda: {"name": "step", "outputs": ((4096,),), "temp_bytes": 0},
    "phase_buffers": lambda: {"name": "step", "fn": lambda x: x},
    "allocator_settings": lambda: {"gpu": "RTX 4090", "environ": {}},
}


def _jax_program_params() -> list[tuple[str, str]]:
    from memfit.estimate.xla import program as jax_program

    return [
        (name, param.name)
        for name in JAX_PROGRAM_CASES
        for param in inspect.signature(getattr(jax_program, name)).parameters.values()
        if param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
    ]


def test_every_callable_of_the_loop_replay_is_covered() -> None:
    from memfit.estimate.xla import program as jax_program

    records = {"ProgramReplay", "Call", "Allocate", "Release", "Rebind"}  # walked below
    found = {n for n in jax_program.__all__ if callable(getattr(jax_program, n))} - records
    assert found == set(JAX_PROGRAM_CASES), found ^ set(JAX_PROGRAM_CASES)


@pytest.mark.parametrize(("name", "param"), _jax_program_params())
def test_the_loop_replay_refuses_a_wrong_type_naming_the_argument(name: str, param: str) -> None:
    from memfit.estimate.xla import program as jax_program

    kwargs = {**JAX_PROGRAM_CASES[name](), param: WRONG}
    with pytest.raises(ConfigError) as info:
        getattr(jax_program, name)(**kwargs)
    assert param in (info.value.key_path or ""), str(info.value)


def _events() -> list[tuple[int, str]]:
    import dataclasses

    return [
        (index, f.name) for index, event in enumerate(_loop()) for f in dataclasses.fields(event)
    ]


@pytest.mark.parametrize(("index", "field"), _events())
def test_every_field_of_every_event_is_checked(index: int, field: str) -> None:
    """A wrong type in any field of Call, Allocate, Release or Rebind is a ConfigError naming
    the event and the field (``loop.1.outputs``), never an ``unhashable type``."""
    import dataclasses

    from memfit.estimate.xla.program import replay_program

    loop = _loop()
    loop[index] = dataclasses.replace(loop[index], **{field: WRONG})
    for bad in (WRONG, ["a"]):
        loop[index] = dataclasses.replace(loop[index], **{field: bad})
        with pytest.raises(ConfigError) as info:
            replay_program(**{**_replay_args(), "loop": loop})
        assert info.value.key_path == f"loop.{index}.{field}", str(info.value)


#: Sizes that cannot be real: each is refused, never rounded or dropped.
UNREAL_SIZES = [-1, 1.5, float("nan"), float("inf"), "4096", True, 2**63, None]


@pytest.mark.parametrize("bad", UNREAL_SIZES, ids=repr)
@pytest.mark.parametrize(
    ("make", "where"),
    [
        (lambda b: {"initial": {"state": [b]}}, "initial.state"),
        (lambda b: {"loop": [*_loop()[:1], *_loop()[1:], _allocate(b)]}, "loop.5.sizes"),
        (lambda b: {"limit_bytes": b}, "limit_bytes"),
        (lambda b: {"phases": {"step": _phase(temp_bytes=b)}}, "phases.step.temp_bytes"),
        (
            lambda b: {"phases": {"step": _phase(first_call_bytes=b)}},
            "phases.step.first_call_bytes",
        ),
        (lambda b: {"phases": {"step": _phase(outputs=((b,), (8,)))}}, "phases.step.outputs[0]"),
    ],
)
def test_a_size_that_cannot_be_real_is_refused_by_the_replay(
    make: Callable[[Any], dict[str, Any]], where: str, bad: Any
) -> None:
    """Issue 45: ``temp_bytes=-1`` and ``nan`` were dropped (``> 0`` is false), and the
    replay's peak was wrong without a word."""
    from memfit.estimate.xla.program import replay_program

    with pytest.raises(ConfigError) as info:
        replay_program(**{**_replay_args(), **make(bad)})
    assert info.value.key_path == where, str(info.value)


def _allocate(size: Any) -> Any:
    from memfit.estimate.xla.program import Allocate

    return Allocate("more", (size,))


def _phase(**fields: Any) -> Any:
    """A phase built past its own check (as a subclass or ``object.__setattr__`` can)."""
    from memfit.estimate.xla.program import PhaseBuffers

    phase = _phases()["step"]
    bare = object.__new__(PhaseBuffers)
    for name in ("name", "outputs", "temp_bytes", "first_call_bytes"):
        object.__setattr__(bare, name, fields.get(name, getattr(phase, name)))
    return bare


@pytest.mark.parametrize("bad", UNREAL_SIZES, ids=repr)
@pytest.mark.parametrize("field", ["temp_bytes", "first_call_bytes"])
def test_phase_buffers_refuse_a_size_that_cannot_be_real(field: str, bad: Any) -> None:
    from memfit.estimate.xla.program import PhaseBuffers

    with pytest.raises(ConfigError) as info:
        PhaseBuffers("step", ((4096,),), **{"temp_bytes": 0, field: bad})
    assert info.value.key_path == field, str(info.value)


@pytest.mark.parametrize("bad", UNREAL_SIZES, ids=repr)
def test_the_bfc_model_refuses_a_request_that_cannot_be_real(bad: Any) -> None:
    """Issue 45: ``BfcAllocator(...).allocate(1.5)`` was taken as 1 byte."""
    from memfit.allocator.bfc import BfcAllocator

    pool = BfcAllocator(2**30, preallocate=True)
    with pytest.raises(ConfigError) as info:
        pool.allocate(bad)
    assert info.value.key_path == "nbytes"
    assert pool.num_allocs == 0


def test_the_issue_cases_of_the_loop_replay() -> None:
    from memfit.estimate.xla.program import Call, allocator_settings, replay_program

    args = _replay_args()
    cases = [
        (lambda: replay_program([8], args["phases"], args["loop"], limit_bytes=2**30), "initial"),
        (
            lambda: replay_program({}, {"step": "step"}, args["loop"], limit_bytes=2**30),
            "phases.step",
        ),
        (lambda: replay_program({}, args["phases"], 5, limit_bytes=2**30), "loop"),
        (
            lambda: replay_program({}, args["phases"], [Call("step", "ab")], limit_bytes=2**30),
            "loop.0.outputs",
        ),
        (lambda: allocator_settings("RTX 4090", 5), "environ"),
    ]
    for call, where in cases:
        with pytest.raises(ConfigError) as info:
            call()
        assert info.value.key_path == where, str(info.value)


# --- target configs (issue 45): memfit.hardware.xla_target and `memfit gpus --target-config` ---


def _card() -> Any:
    return memfit.gpu("RTX 4070")


# "name" -> the valid arguments a call needs
TARGET_CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "arch_limits": lambda: {"cc": (8, 9)},
    "base_for_limit": lambda: {"bytes_limit": 2**30},
    "card_figures": lambda: {"name": "NVIDIA GeForce RTX 4070"},
    "cuda_total_bytes": lambda: {"spec": _card()},
    "target_config": lambda: {"spec": _card()},
    "xla_memory_limit": lambda: {"base_bytes": 2**30, "io_bytes": 2**20},
}


def _target_params() -> list[tuple[str, str]]:
    from memfit.hardware import xla_target

    return [
        (name, p.name)
        for name in TARGET_CASES
        for p in inspect.signature(getattr(xla_target, name)).parameters.values()
    ]


def test_every_callable_of_the_target_configs_is_covered() -> None:
    from memfit.hardware import xla_target

    found = {
        n
        for n in xla_target.__all__
        if callable(getattr(xla_target, n)) and not inspect.isclass(getattr(xla_target, n))
    }
    assert found == set(TARGET_CASES), found ^ set(TARGET_CASES)


@pytest.mark.parametrize("bad", [WRONG, None, -1, 2**64 + 1, float("nan"), "x" * 5000])
@pytest.mark.parametrize(("name", "param"), _target_params())
def test_the_target_configs_refuse_what_is_not_a_card_or_a_size(
    name: str, param: str, bad: Any
) -> None:
    """Issue 45: ``target_config``, ``arch_limits`` and ``base_for_limit`` (which the docs
    name) crashed on wrong types; every argument is now checked and named."""
    from memfit.hardware import xla_target

    if name == "card_figures" and isinstance(bad, str):
        assert xla_target.card_figures(bad) is None  # a name it has no figures for
        return
    kwargs = {**TARGET_CASES[name](), param: bad}
    with pytest.raises(ConfigError) as info:
        getattr(xla_target, name)(**kwargs)
    assert param in (info.value.key_path or "") or info.value.key_path == "gpu", str(info.value)


def test_a_target_config_of_a_card_named_or_given_is_the_same() -> None:
    from memfit.hardware.xla_target import target_config

    assert target_config("RTX 4070") == target_config(_card())
