"""Integrations name what is missing and refuse objects that are not what they need."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from memfit import _lazy
from memfit.errors import BackendUnavailable, ConfigError
from memfit.integrations.brax import check_ppo


def test_require_names_the_dependency_that_is_really_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(name: str) -> None:
        raise ModuleNotFoundError("import of torch halted; None in sys.modules", name="torch")

    monkeypatch.setattr(_lazy.importlib, "import_module", fail)
    with pytest.raises(BackendUnavailable, match=r"lightning.pytorch needs torch") as info:
        _lazy.require("lightning.pytorch")
    assert info.value.hint == "pip install torch"


def test_require_hint_for_the_framework_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    from memfit.integrations.gymnasium import MemoryWrapper

    with pytest.raises(BackendUnavailable, match=r"gymnasium is not installed") as info:
        MemoryWrapper(object())
    assert info.value.hint == "pip install gymnasium"


def test_transformers_helpers_refuse_objects_that_are_not_trainer_parts() -> None:
    from memfit.integrations.transformers import apply_batch, train

    with pytest.raises(ConfigError, match=r"expected a transformers.TrainingArguments") as info:
        apply_batch(object(), 4)
    assert info.value.key_path == "args"
    pytest.importorskip("transformers")
    with pytest.raises(ConfigError, match=r"trainer must be a transformers.Trainer"):
        train(object())
    with pytest.raises(ConfigError, match=r"trainer.args has no per_device_train_batch_size"):
        train(SimpleNamespace(train=lambda: None, args=None))


@pytest.mark.parametrize("value", [2048.0, "2048"])
def test_check_ppo_suggests_the_whole_number_a_wrong_type_stands_for(value: object) -> None:
    pytest.importorskip("jax")
    kwargs = dict(
        num_envs=value, batch_size=1024, num_minibatches=32, unroll_length=10, episode_length=1000
    )
    with pytest.raises(ConfigError, match=r"num_envs must be a positive integer") as info:
        check_ppo(**kwargs)
    assert info.value.hint is not None and "num_envs=2048" in info.value.hint


def test_prometheus_without_its_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    from memfit.integrations.prometheus import PrometheusSink

    with pytest.raises(BackendUnavailable, match=r"prometheus_client is not installed") as info:
        PrometheusSink()
    assert info.value.hint is not None and "memfit[prometheus]" in info.value.hint
