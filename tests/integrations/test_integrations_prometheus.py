"""Prometheus with the real prometheus-client: ``memfit watch --prometheus`` and a Recorder
sink, each scraped over loopback (127.0.0.1, an ephemeral port, stopped by the test)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import memfit
import memfit.cli.watch as watch_cli
from memfit.backends.base import DeviceSnapshot, ProcessSnapshot, SystemSnapshot
from memfit.cli.main import main
from memfit.errors import ConfigError
from memfit.runtime.events import MemoryEvent

pytest.importorskip("prometheus_client", reason="the exporter is tested with prometheus-client")
from prometheus_client.parser import text_string_to_metric_families

from memfit.integrations.prometheus import PrometheusSink, parse_address

GiB = 2**30


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics over loopback and parse it with prometheus-client's own parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode("utf-8")
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


class _Frames:
    """A probe whose snapshots change: a process appears, then leaves."""

    def __init__(self) -> None:
        self.calls = 0

    def snapshot(self) -> SystemSnapshot:
        self.calls += 1
        procs = (
            ProcessSnapshot(pid=4242, name="python", used_bytes=3 * GiB),
            ProcessSnapshot(pid=77, name="Xorg", used_bytes=GiB // 4),
        )
        dev = DeviceSnapshot(
            index=0,
            name="Sim 8G",
            uuid="GPU-0000",
            total_bytes=8 * GiB,
            device_used_bytes=(3 + self.calls) * GiB // 2,
            free_bytes=8 * GiB - (3 + self.calls) * GiB // 2,
            utilization_percent=40,
            processes=procs if self.calls < 3 else procs[1:],
            backend="simulated",
        )
        return SystemSnapshot(source="simulated", devices=(dev,))


@pytest.fixture
def scraped(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[Any, float]]]:
    """Scrapes taken by ``memfit watch --prometheus`` right after each frame is exported."""
    taken: list[dict[Any, float]] = []
    original = PrometheusSink.snapshot

    def snapshot_then_scrape(self: PrometheusSink, snap: SystemSnapshot) -> None:
        original(self, snap)
        assert self.port is not None and self.host == "127.0.0.1"
        taken.append(_scrape(self.port))

    monkeypatch.setattr(PrometheusSink, "snapshot", snapshot_then_scrape)
    monkeypatch.setattr(watch_cli, "make_probe", lambda: (_Frames(), []))
    yield taken


def test_watch_serves_gpu_and_process_memory(
    scraped: list[dict[Any, float]], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["watch", "--prometheus", "127.0.0.1:0", "--interval", "0.01", "--count", "3"]
    assert main(args) == 0
    assert "serving Prometheus metrics on http://127.0.0.1:" in capsys.readouterr().err
    gpu = (("gpu", "0"), ("name", "Sim 8G"), ("uuid", "GPU-0000"))
    first, _, last = scraped  # one scrape per frame, three frames
    assert first[("gpu_memory_total_bytes", gpu)] == 8 * GiB
    assert first[("gpu_memory_used_bytes", gpu)] == 2 * GiB
    assert first[("gpu_memory_free_bytes", gpu)] == 6 * GiB
    assert last[("gpu_memory_used_bytes", gpu)] == 3 * GiB
    assert first[("gpu_utilization_percent", gpu)] == 40
    python = (
        "gpu_process_memory_used_bytes",
        (("gpu", "0"), ("pid", "4242"), ("process", "python")),
    )
    assert first[python] == 3 * GiB
    assert python not in last  # the process left: its series is gone, not left at 3 GiB
    assert ("gpu_memory_reserved_bytes", gpu) not in first  # unknown is not 0


def test_watch_refuses_a_bad_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--prometheus", "localhost:http"]) == 1
    err = capsys.readouterr().err
    assert "Error: --prometheus: not a listen address" in err and "Hint:" in err


def test_recorder_sink_exports_samples_and_events() -> None:
    import torch

    with PrometheusSink("127.0.0.1:0") as sink:
        assert sink.port
        rec = memfit.Recorder(None, log=False, sinks=[sink])
        with memfit.simulate_gpu("64MiB"):
            keep = torch.zeros(2**20)  # 4 MiB live
            rec.step(7)
            rec.on_event(MemoryEvent(kind="retry", step=7, source="TrainGuard", message="x"))
            rec.on_event(MemoryEvent(kind="retry", step=8, source="TrainGuard", message="y"))
            rec.on_event(MemoryEvent(kind="split", step=8, source="skrl", message="z"))
            metrics = _scrape(sink.port)
        rec.close()
        del keep
    assert metrics[("memfit_allocated_bytes", (("gpu", ""),))] == 4 * 2**20
    assert metrics[("memfit_budget_bytes", (("gpu", ""),))] == 64 * 2**20
    assert metrics[("memfit_step", ())] == 7
    retry = (("kind", "retry"), ("source", "TrainGuard"))
    assert metrics[("memfit_events_total", retry)] == 2
    assert metrics[("memfit_events_total", (("kind", "split"), ("source", "skrl")))] == 1
    # closed: nothing listens any more
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics", timeout=2)


def test_addresses() -> None:
    assert parse_address(":9400") == ("", 9400)
    assert parse_address("9400") == ("", 9400)
    assert parse_address("[::1]:9400") == ("::1", 9400)
    for bad in ("", "host:", ":99999", "a:b"):
        with pytest.raises(ConfigError, match="not a listen address"):
            parse_address(bad)
    with PrometheusSink("127.0.0.1:0") as sink, pytest.raises(ConfigError, match="cannot listen"):
        PrometheusSink(f"127.0.0.1:{sink.port}")


def test_watch_refuses_prometheus_with_one_frame(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--once", "--prometheus", ":0"]) == 1
    assert "Error: --prometheus: --prometheus serves while the live view runs" in (
        capsys.readouterr().err
    )
