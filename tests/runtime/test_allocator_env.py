"""Allocator settings: real strings with their verdicts, shell snippets, recommend, configure."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

from memfit import ConfigError
from memfit.allocator.settings import PROFILES, SHELLS, recommend, render_shell
from memfit.allocator.settings_check import (
    JAX_VARIABLES,
    TORCH_VARIABLES,
    check_jax_env,
    check_shell,
    check_torch_conf,
    parse_torch_conf,
)
from memfit.allocator.shell import parse_shell_assignments
from memfit.allocator.xla_fraction import xla_fraction_variable
from memfit.runtime.allocator_env import (
    check_environment,
    configure,
    installed_torch_version,
    jax_gpu_started,
    torch_cuda_initialized,
)

# Real PYTORCH_CUDA_ALLOC_CONF values seen in bug reports and docs, with the verdict
# (list of problem codes, in order; [] = valid).
TORCH_TABLE: list[tuple[str, list[str]]] = [
    ("expandable_segments:True", []),
    ("expandable_segments:true", ["bad-value"]),
    ("max_split_size_mb:128", []),
    ("max_split_size_mb:512,garbage_collection_threshold:0.6", []),
    ("garbage_collection_threshold:0.6,max_split_size_mb:128", []),
    ("max_split_size_mb:20", ["bad-value"]),
    ("max_split_size_mb:21", []),
    ("max_split_size_mb=128", ["malformed"]),
    ("max_split_size_mb:-1", ["bad-value"]),
    ("garbage_collection_threshold:1.2", ["bad-value"]),
    ("garbage_collection_threshold:1", ["bad-value"]),
    ("roundup_power2_divisions:4", []),
    ("roundup_power2_divisions:3", ["bad-value"]),
    ("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", []),
    ("roundup_power2_divisions:[300:1,>:8]", ["bad-value"]),
    ("roundup_power2_divisions:[256:3]", ["bad-value"]),
    ("backend:cudaMallocAsync", []),
    ("backend:cudamallocasync", ["bad-value"]),
    ("backend:cudaMallocAsync,expandable_segments:True", ["conflict"]),
    ("expandable_segment:True", ["unknown-option"]),
    ("expandable_segments:True,expandable_segments:False", ["duplicate-option"]),
    ("pinned_use_cuda_host_register:True,pinned_num_register_threads:8", []),
    ("pinned_num_register_threads:6", ["bad-value"]),
    ("release_lock_on_cudamalloc:True", []),
    ("expandable_segments:True, max_split_size_mb:256", []),
    ("expandable_segments", ["malformed"]),
    ("max_split_size_mb:", ["malformed"]),
]


@pytest.mark.parametrize(("text", "codes"), TORCH_TABLE)
def test_torch_string_verdicts(text: str, codes: list[str]) -> None:
    problems = check_torch_conf(text, variable="PYTORCH_CUDA_ALLOC_CONF")
    assert [p.code for p in problems] == codes
    for p in problems:
        assert p.variable == "PYTORCH_CUDA_ALLOC_CONF"
        assert p.message and p.hint
        assert p.to_dict()["code"] == p.code


def test_problem_names_the_option() -> None:
    (p,) = check_torch_conf("max_split_size_mb:16")
    assert p.option == "max_split_size_mb"
    assert "20" in p.message
    (q,) = check_torch_conf("expandable_segment:True")
    assert q.option == "expandable_segment"
    assert "expandable_segments" in (q.hint or "")


def test_parse_keeps_lists_whole() -> None:
    pairs, problems = parse_torch_conf("roundup_power2_divisions:[64:8, 256:4, >:1],backend:native")
    assert problems == []
    assert pairs == [("roundup_power2_divisions", "[64:8,256:4,>:1]"), ("backend", "native")]


JAX_TABLE: list[tuple[dict[str, str], list[str]]] = [
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, []),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"}, []),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".95"}, []),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"}, ["bad-value"]),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0"}, ["bad-value"]),
    ({"XLA_CLIENT_MEM_FRACTION": "75%"}, ["bad-value"]),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "no"}, ["bad-value"]),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, []),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"}, []),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "arena"}, ["bad-value"]),
    (
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"},
        ["conflict"],
    ),
    (
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"},
        ["conflict"],
    ),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5", "XLA_CLIENT_MEM_FRACTION": ".6"}, ["conflict"]),
]


@pytest.mark.parametrize(("env", "codes"), JAX_TABLE)
def test_jax_verdicts(env: dict[str, str], codes: list[str]) -> None:
    assert [p.code for p in check_jax_env(env)] == codes


def test_both_torch_names_differ_is_an_error() -> None:
    env = {
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
    }
    (p,) = check_environment(env)
    assert p.code == "both-names-differ" and p.severity == "error"
    same = {
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments: True",
    }
    assert check_environment(same) == []


def test_check_environment_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*TORCH_VARIABLES, *JAX_VARIABLES):
        monkeypatch.delenv(var, raising=False)
    assert check_environment() == []
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:8")
    assert [p.code for p in check_environment()] == ["bad-value"]


# Shell snippets, with verdicts.
SHELL_TABLE: list[tuple[str, list[str]]] = [
    ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", []),
    (
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
        "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128",
        ["exported-twice"],
    ),
    (
        'export PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"\n'
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        ["exported-twice"],
    ),
    (
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128",
        [],
    ),
    ("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:16 python train.py", ["bad-value"]),
    (
        "export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=.5",
        [],
    ),
    (
        "export XLA_PYTHON_CLIENT_ALLOCATOR=platform; export XLA_PYTHON_CLIENT_PREALLOCATE=true",
        ["conflict"],
    ),
    (
        "set -gx PYTORCH_ALLOC_CONF expandable_segments:True\n"
        "set -gx PYTORCH_ALLOC_CONF garbage_collection_threshold:0.6",
        ["exported-twice"],
    ),
    ('$env:PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True"', []),
    (
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\nunset PYTORCH_CUDA_ALLOC_CONF\n"
        "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:256",
        [],
    ),
    (
        "export PYTORCH_ALLOC_CONF=expandable_segments:True\n"
        "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:256",
        ["both-names-differ"],
    ),
    ("# export PYTORCH_CUDA_ALLOC_CONF=junk\nexport OTHER=1\nexport OTHER=2", []),
]


@pytest.mark.parametrize(("script", "codes"), SHELL_TABLE)
def test_shell_verdicts(script: str, codes: list[str]) -> None:
    assert [p.code for p in check_shell(script)] == codes


def test_exported_twice_names_the_lost_options() -> None:
    (p,) = check_shell(
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
        "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128"
    )
    assert p.severity == "error"
    assert p.variable == "PYTORCH_CUDA_ALLOC_CONF"
    assert "line 1" in p.message and "line 2" in p.message
    assert "lost: expandable_segments:True" in p.message


def test_same_value_twice_is_only_a_warning() -> None:
    (p,) = check_shell(
        "export XLA_PYTHON_CLIENT_PREALLOCATE=false\nexport XLA_PYTHON_CLIENT_PREALLOCATE=false"
    )
    assert p.code == "exported-twice" and p.severity == "warning"


def test_unclosed_quote_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot read") as info:
        check_shell("export A='x")
    assert info.value.key_path == "line 1"


def test_parse_shell_assignments_forms() -> None:
    text = (
        "export A=1 B='x y'\n"
        "C=3 python run.py\n"
        "env D=4 python run.py\n"
        "set -x E 5\n"
        "set --erase E\n"
        "$env:F = 'six'\n"
        "echo G=7\n"
    )
    assert parse_shell_assignments(text) == [
        (1, "A", "1"),
        (1, "B", "x y"),
        (2, "C", "3"),
        (3, "D", "4"),
        (4, "E", "5"),
        (5, "E", None),
        (6, "F", "six"),
    ]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("platform", ["linux", "win32"])
@pytest.mark.parametrize("torch_version", [(2, 5), (2, 13)])
def test_recommendations_are_valid(
    profile: str, platform: str, torch_version: tuple[int, int]
) -> None:
    rec = recommend(profile, platform=platform, torch_version=torch_version)
    env = rec.environ()
    assert check_environment(env) == []
    assert all(s.reason for s in rec.settings)
    assert all(reason for _k, _v, reason in rec.options)
    torch_vars = [v for v in env if v in TORCH_VARIABLES]
    if torch_version < (2, 8):
        assert torch_vars == ["PYTORCH_CUDA_ALLOC_CONF"]
    else:
        assert sorted(torch_vars) == sorted(TORCH_VARIABLES)
    keys = {k for k, _v, _r in rec.options}
    if platform == "win32":
        assert "max_split_size_mb" in keys and "expandable_segments" not in keys
    else:
        assert "expandable_segments" in keys


def test_profiles_differ_where_they_should() -> None:
    shared = recommend("shared-gpu", platform="linux", torch_version=(2, 13)).environ()
    assert shared["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert "garbage_collection_threshold:0.6" in shared["PYTORCH_ALLOC_CONF"]
    inference = recommend("inference", platform="linux", torch_version=(2, 13)).environ()
    assert "roundup_power2_divisions" in inference["PYTORCH_ALLOC_CONF"]
    training = recommend("training", platform="linux", torch_version=(2, 13)).environ()
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in training


def test_unknown_profile() -> None:
    with pytest.raises(ConfigError, match="unknown profile"):
        recommend("gaming")


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("profile", PROFILES)
def test_rendered_shell_parses_back(shell: str, profile: str) -> None:
    rec = recommend(profile, platform="linux", torch_version=(2, 13))
    script = render_shell(rec.settings, shell)
    parsed = {name: value for _line, name, value in parse_shell_assignments(script)}
    assert parsed == rec.environ()
    assert check_shell(script) == []


def test_render_unknown_shell() -> None:
    with pytest.raises(ConfigError, match="unknown shell"):
        render_shell({"A": "1"}, "tcsh")


def test_configure_writes_and_merges() -> None:
    env: dict[str, str] = {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:False"
    }
    written = configure(
        expandable_segments=True,
        garbage_collection_threshold=0.6,
        jax_preallocate=False,
        jax_mem_fraction=0.5,
        environ=env,
    )
    conf = "max_split_size_mb:128,expandable_segments:True,garbage_collection_threshold:0.6"
    assert env["PYTORCH_ALLOC_CONF"] == conf
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == conf
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env[xla_fraction_variable()[0]] == "0.5"  # the name the installed jaxlib reads
    assert written == {k: env[k] for k in written}
    assert check_environment(env) == []


def test_configure_uses_the_new_jax_fraction_name_when_set() -> None:
    env = {"XLA_CLIENT_MEM_FRACTION": ".3"}
    configure(jax_mem_fraction=0.4, environ=env)
    assert env == {"XLA_CLIENT_MEM_FRACTION": "0.4"}
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".3"}  # the one already set wins: never both
    configure(jax_mem_fraction=0.4, environ=env)
    assert env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.4"}


def test_configure_nothing_requested_changes_nothing() -> None:
    env = {"X": "1"}
    assert configure(environ=env) == {}
    assert env == {"X": "1"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_split_size_mb": 16}, "greater than 20"),
        ({"garbage_collection_threshold": 1.5}, r"\(0, 1\)"),
        ({"roundup_power2_divisions": 3}, "power of two"),
        ({"backend": "jemalloc"}, "backend"),
        ({"jax_mem_fraction": 1.2}, "fraction"),
        ({"jax_allocator": "arena"}, "unknown allocator"),
    ],
)
def test_configure_rejects_bad_values_and_writes_nothing(
    kwargs: dict[str, object], match: str
) -> None:
    env: dict[str, str] = {}
    with pytest.raises(ConfigError, match=match):
        configure(environ=env, **kwargs)  # type: ignore[arg-type]
    assert env == {}


def _fake_torch(initialized: bool) -> ModuleType:
    mod = ModuleType("torch")
    mod.cuda = SimpleNamespace(is_initialized=lambda: initialized)  # type: ignore[attr-defined]
    return mod


def test_configure_refuses_after_torch_initialised_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(True))
    assert torch_cuda_initialized()
    env: dict[str, str] = {}
    with pytest.raises(ConfigError, match="already initialised CUDA"):
        configure(expandable_segments=True, environ=env)
    assert env == {}
    # JAX settings alone are still fine
    configure(jax_preallocate=False, environ=env)
    assert env == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def test_configure_allows_torch_before_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(False))
    assert not torch_cuda_initialized()
    assert configure(expandable_segments=True, environ={})


def _fake_jax(monkeypatch: pytest.MonkeyPatch, backends: dict[str, object], started: bool) -> None:
    bridge = ModuleType("jax._src.xla_bridge")
    bridge.backends_are_initialized = lambda: started  # type: ignore[attr-defined]
    bridge._backends = backends  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jax", ModuleType("jax"))
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", bridge)


def test_configure_refuses_after_jax_gpu_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_jax(monkeypatch, {"cuda": SimpleNamespace(platform="gpu")}, started=True)
    assert jax_gpu_started()
    with pytest.raises(ConfigError, match="already started its GPU backend"):
        configure(jax_preallocate=False, environ={})
    assert configure(expandable_segments=True, environ={})


def test_jax_cpu_backend_is_not_a_gpu_start(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_jax(monkeypatch, {"cpu": SimpleNamespace(platform="cpu")}, started=True)
    assert not jax_gpu_started()
    _fake_jax(monkeypatch, {}, started=False)
    assert not jax_gpu_started()


def test_real_jax_on_cpu_reads_as_not_started() -> None:
    jax = pytest.importorskip("jax")
    jax.numpy.zeros(2).block_until_ready()
    if any(d.platform != "cpu" for d in jax.devices()):
        pytest.skip("JAX has a GPU here")
    assert not jax_gpu_started()


def test_configure_applies_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR", raising=False)
    import os

    configure(jax_allocator="platform")
    # popped by hand: monkeypatch.delenv here would restore "platform" at teardown
    assert os.environ.pop("XLA_PYTHON_CLIENT_ALLOCATOR") == "platform"


def test_installed_torch_version_matches_the_package() -> None:
    import torch

    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    assert installed_torch_version() == (major, minor)
