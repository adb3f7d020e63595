"""The family registry: each family declares itself; workload and planner consult it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest

from memfit.core.families import (
    Family,
    evaluate,
    family_for,
    family_names,
    get_family,
    register,
)
from memfit.core.families import registry as registry_module
from memfit.core.families.common import Term, observation_bytes, parameter_terms
from memfit.core.families.offpolicy import replay_transition_bytes
from memfit.core.plan import plan_for_gpu
from memfit.core.workload import OffPolicySpec, Workload, parse_workload
from memfit.errors import ConfigError
from memfit.hardware.catalog import gpu

SAC = """\
family: sac_test
observations: {vector: 17}
action_dim: 6
networks:
  actor: {layers: [256, 256, 12]}
  critic1: {layers: [256, 256, 1]}
  critic2: {layers: [256, 256, 1]}
replay: {placement: auto}
host_memory_bytes: 64MiB
knobs:
  buffer_size: {min: 100000, max: 1000000, step: 100000}
  batch_size: {choices: [256]}
objective: buffer_size
"""


def _sac_terms(
    workload: Workload, values: Mapping[str, int], *, on_device: bool = True
) -> tuple[list[Term], int]:
    fields = replay_transition_bytes(workload, values)
    replay = tuple(values["buffer_size"] * f for f in fields)
    batch = values["batch_size"] * observation_bytes(workload, values)
    out = [*parameter_terms(workload, values), Term("minibatch_data", (batch,))]
    if on_device:
        return [Term("replay_buffer", replay), *out], 0
    return out, sum(replay)


@pytest.fixture
def sac_family() -> Iterator[Family]:
    """A SAC family with a replay buffer, declared in one definition (as one module would)."""
    family = register(
        Family(
            name="sac_test",
            summary="SAC with a replay buffer",
            terms=_sac_terms,
            section="replay",
            schema=OffPolicySpec,
            requires=(("networks", "family sac_test needs networks"),),
            required_names=lambda _w: ("buffer_size", "batch_size"),
            placement=lambda w: (w.replay or OffPolicySpec()).placement,
            placement_knob="replay_placement",
        )
    )
    yield family
    registry_module._REGISTRY.pop("sac_test", None)


def test_builtin_families_are_discovered() -> None:
    assert family_names() == ["custom", "offpolicy", "ppo", "sac", "vision_inference"]
    ppo = get_family("ppo")
    assert ppo.section == "ppo" and ppo.requires[0][0] == "networks"
    assert get_family("offpolicy").placement_knob == "replay_placement"


def test_a_new_family_is_one_definition(sac_family: Family) -> None:
    w = parse_workload(SAC)
    assert family_for(w) is sac_family and w.family_key == "sac_test"
    ev = evaluate(w, {"buffer_size": 100000, "batch_size": 256})
    assert ev.terms["replay_buffer"] == 100000 * (17 * 4 * 2 + 6 * 8 + 12)
    # the planner places its replay buffer through the registry: on an 8 GB card a 1M buffer
    # (about 220 MiB) fits on the device, so no host RAM is needed
    p = plan_for_gpu(w, gpu("RTX 3060 Ti"))
    assert p.knobs["replay_placement"] == "gpu" and p.knobs["buffer_size"] == 1000000
    missing = SAC.replace("  batch_size: {choices: [256]}\n", "")
    with pytest.raises(ConfigError, match="needs batch_size as a knob or a setting"):
        parse_workload(missing)


def test_unknown_family_names_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match="family") as info:
        parse_workload("family: pop\nterms: {a: 1}\n")
    assert info.value.hint is not None and "'ppo'" in info.value.hint
    with pytest.raises(ConfigError, match="unknown family 'pop'") as info:
        get_family("pop")
    assert info.value.hint == "did you mean 'ppo'?"


def test_registering_a_taken_name_needs_replace() -> None:
    ppo = get_family("ppo")
    with pytest.raises(ConfigError, match="already registered"):
        register(Family(name="ppo", summary="x", terms=ppo.terms))
    assert register(ppo) is ppo  # the same family again is fine


def test_family_requirements_come_from_the_family() -> None:
    with pytest.raises(ConfigError, match="needs a vision: section"):
        parse_workload(
            "family: vision_inference\nobservations: {cameras: {height: 8, width: 8}}\n"
            "settings: {num_envs: 1}\n"
        )
    with pytest.raises(ConfigError, match="needs a terms: section"):
        parse_workload("family: custom\n")
