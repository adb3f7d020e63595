"""TensorBoard with the real writer: the Recorder's step series and events written to a
``SummaryWriter`` and read back from the event files; Lightning's callback logging through
the Trainer's TensorBoard logger; the W&B sink through a stand-in with ``wandb.log``'s call
shape (wandb itself is not installed here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import memfit
from memfit.errors import ConfigError
from memfit.monitor.sinks import WandbSink, as_sink
from memfit.runtime.events import MemoryEvent

torch = pytest.importorskip("torch", reason="the simulated GPU counts torch tensors")
pytest.importorskip("tensorboard", reason="the event files are read back with tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

MiB = 2**20


def _read(folder: Path) -> EventAccumulator:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _text(acc: EventAccumulator, tag: str) -> list[tuple[int, str]]:
    return [(e.step, e.tensor_proto.string_val[0].decode("utf-8")) for e in acc.Tensors(tag)]


def test_recorder_writes_steps_and_events_to_a_summary_writer(tmp_path: Path) -> None:
    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    rec = memfit.Recorder(None, log=False, sinks=[writer])
    live = []
    with memfit.simulate_gpu("256MiB"):
        for step in range(4):
            live.append(torch.zeros(MiB // 4))  # one more MiB each step
            rec.step(step)
        rec.on_event(MemoryEvent(kind="oom", step=2, source="TrainGuard", message="no room"))
        rec.on_event(MemoryEvent(kind="split", step=2, source="TrainGuard", message="halved"))
        rec.on_event(MemoryEvent(kind="split", step=3, source="TrainGuard", message="again"))
    rec.close()
    writer.close()
    acc = _read(tmp_path / "tb")
    allocated = [(e.step, e.value) for e in acc.Scalars("memory/allocated_mib")]
    assert allocated == [(0, 1.0), (1, 2.0), (2, 3.0), (3, 4.0)]
    assert [e.value for e in acc.Scalars("memory/budget_mib")] == [256.0] * 4
    assert [(e.step, e.value) for e in acc.Scalars("memory/events/split")] == [(2, 1.0), (3, 2.0)]
    assert [(e.step, e.value) for e in acc.Scalars("memory/events/oom")] == [(2, 1.0)]
    texts = _text(acc, "memory/events/text_summary")
    assert texts[0] == (2, "TrainGuard oom: no room") and len(texts) == 3
    assert "memory/reserved_mib" not in acc.Tags()["scalars"]  # unknown here: not written as 0


def test_lightning_callback_logs_through_the_trainers_logger(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch", reason="the callback is Lightning's")
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch.utils.data import DataLoader, TensorDataset

    from memfit.integrations import lightning as mlight

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> Any:
            g = torch.Generator().manual_seed(0)
            data = TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
            return DataLoader(data, batch_size=8)

    rec = memfit.Recorder(None, log=False)
    logger = TensorBoardLogger(str(tmp_path), name="run", version=0)
    trainer = pl.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[mlight.MemfitCallback(rec, log_metrics=True)],
    )
    with memfit.simulate_gpu("64MiB"):
        trainer.fit(Tiny())
    acc = _read(tmp_path / "run" / "version_0")
    logged = [(e.step, e.value) for e in acc.Scalars("memory/allocated_mib")]
    assert [step for step, _ in logged] == [1, 2, 3]
    assert logged == [(s["step"], s["allocated_bytes"] / MiB) for s in rec.samples]


def test_wandb_sink_and_refusals() -> None:
    class Run:
        config = None  # wandb runs have a config; the sink only needs it to exist

        def __init__(self) -> None:
            self.calls: list[tuple[dict[str, float], int | None]] = []

        def log(self, data: dict[str, float], step: int | None = None) -> None:
            self.calls.append((data, step))

    run = Run()
    sink = as_sink(run)
    assert isinstance(sink, WandbSink)
    sink.sample({"allocated_bytes": 3 * MiB, "step": 5})
    sink.sample({"allocated_bytes": 2 * MiB, "step": 4})  # W&B steps only grow
    sink.event(MemoryEvent(kind="retry", step=6, source="RolloutGuard", message="m"))
    assert run.calls == [
        ({"memory/allocated_mib": 3.0}, 5),
        ({"memory/allocated_mib": 2.0}, None),
        ({"memory/events/retry": 1.0}, 6),
    ]
    with pytest.raises(ConfigError, match="sample\\(\\) and event\\(\\)"):
        memfit.Recorder(None, sinks=[object()])


def test_a_failing_sink_does_not_stop_the_run(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def __init__(self) -> None:
            self.calls = 0

        def sample(self, record: Any) -> None:
            self.calls += 1
            raise OSError("dashboard down")

        def event(self, event: MemoryEvent) -> None:
            self.calls += 1

    broken = Broken()
    rec = memfit.Recorder(None, log=False, sinks=[broken])
    for step in range(3):
        rec.step(step)
    rec.close()
    assert broken.calls == 1 and len(rec.samples) == 3
    assert "gets nothing more" in caplog.text
