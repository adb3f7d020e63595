"""memfit.integrations.lightning against the real Lightning Trainer (CPU)."""

from __future__ import annotations

from typing import Any

import pytest

import memfit
from memfit.errors import ConfigError, InfeasiblePlan
from memfit.integrations import lightning as mlight

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class Tiny(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, batch_size: int = 4, manual: bool = True) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.inject = 0.0
        self.net = torch.nn.Linear(4, 1)
        self.automatic_optimization = not manual
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 4, generator=g)
        self.y = torch.randn(64, 1, generator=g)

    def loss(self, batch: Any) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        guard = mlight.guard(self, self.loss)
        if self.inject:  # OOMs inside the guarded step only (not in Lightning's own loop)
            with memfit.testing.inject_oom(self.inject, seed=batch_idx, limit=1):
                loss = guard(batch)
        else:
            loss = guard(batch)
        self.log("loss", loss)
        return None

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self) -> Any:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size)


def _trainer(callbacks: list[Any], steps: int = 6) -> Any:
    return pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )


def _fit(inject: float) -> tuple[Tiny, Any, memfit.Recorder]:
    torch.manual_seed(0)
    model = Tiny()
    model.inject = inject
    rec = memfit.Recorder(None, log=False)
    cb = mlight.MemfitCallback(rec, batch_size=16)
    _trainer([cb]).fit(model)
    return model, cb, rec


def test_callback_sets_batch_size_records_steps_and_guard_survives_oom() -> None:
    clean, cb, rec = _fit(0.0)
    assert clean.batch_size == 16 and cb.chosen_batch_size == 16
    assert [s["step"] for s in rec.samples] == [1, 2, 3, 4, 5, 6]  # global_step after each
    chaotic, _, rec2 = _fit(0.2)
    guard = chaotic._memfit_guard
    assert guard.steps == 6
    assert any(e.kind == "oom" for e in guard.events)
    assert any(e.kind == "oom" for e in rec2.events)  # guard events reach the recorder
    for a, b in zip(clean.parameters(), chaotic.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_guard_needs_manual_optimisation() -> None:
    model = Tiny(manual=False)
    with pytest.raises(ConfigError, match="manual optimisation"):
        _trainer([], steps=1).fit(model)


def test_callback_rejects_missing_attribute() -> None:
    class NoBatch(Tiny):
        def __init__(self) -> None:
            super().__init__()
            del self.batch_size

        def train_dataloader(self) -> Any:
            return DataLoader(TensorDataset(self.x, self.y), batch_size=4)

    with pytest.raises(ConfigError, match="batch_size"):
        _trainer([mlight.MemfitCallback(batch_size=8)], steps=1).fit(NoBatch())


class _Fit:
    def __init__(self, intercept: float, slope: float) -> None:
        self.intercept, self.slope, self.residual = intercept, slope, 0.0


class _Estimate:
    def __init__(self, fit: _Fit | None) -> None:
        self.fit = self.reserved_fit = fit


def test_batch_size_from_estimate() -> None:
    est = _Estimate(_Fit(intercept=1000.0, slope=100.0))
    assert mlight.batch_size_from_estimate(est, 5000) == 40
    assert mlight.batch_size_from_estimate(est, 5000, multiple_of=8) == 40
    assert mlight.batch_size_from_estimate(est, 4950, multiple_of=8) == 32
    assert mlight.batch_size_from_estimate(est, 10**9, high=512) == 512
    with pytest.raises(InfeasiblePlan, match="over the budget"):
        mlight.batch_size_from_estimate(est, 1050, low=2)
    with pytest.raises(ConfigError, match="no fit"):
        mlight.batch_size_from_estimate(_Estimate(None), 5000)


def test_batch_size_from_a_real_estimate() -> None:
    def build() -> Any:
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
        )
        return model, torch.optim.Adam(model.parameters())

    def step(model: Any, opt: Any, batch: Any) -> None:
        model(batch).sum().backward()
        opt.step()
        opt.zero_grad()

    est = memfit.estimate_torch(build, step, lambda b: torch.randn(b, 64), [8, 16, 32])
    budget = int(est.fit.intercept + est.fit.slope * 100)
    b = mlight.batch_size_from_estimate(est, budget)
    assert 99 <= b <= 100


def test_keep_effective_batch() -> None:
    assert mlight.keep_effective_batch(64, 24) == (16, 4)
    assert mlight.keep_effective_batch(64, 100) == (64, 1)
    assert mlight.keep_effective_batch(12, 5) == (4, 3)
    with pytest.raises(ConfigError, match="micro"):
        mlight.keep_effective_batch(12, 0)


# -- The guard next to Lightning's BatchSizeFinder and accumulation (issue 14, item 9) ---------


class Wide(pl.LightningModule):  # type: ignore[misc]
    """Activations grow with the batch, so a simulated GPU's budget decides what fits."""

    def __init__(self, batch_size: int = 2, accumulate: int = 1, manual: bool = True) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.accumulate = accumulate
        self.automatic_optimization = not manual
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)
        )
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(256, 32, generator=g)
        self.y = torch.randn(256, 1, generator=g)
        self.losses: list[Any] = []

    def loss(self, batch: Any) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.automatic_optimization:
            return self.loss(batch)
        self.losses.append(mlight.guard(self, self.loss, accumulate=self.accumulate)(batch))
        return None

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> Any:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size)


def _peak(batch: int) -> int:
    """The simulated peak of one bare training step of ``Wide`` at ``batch`` items."""
    model = Wide()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with memfit.simulate_gpu("1GiB") as gpu:
        gpu.reset_peak()
        model.loss((model.x[:batch], model.y[:batch])).backward()
        opt.step()
        return gpu.peak_allocated_bytes


@pytest.mark.slow  # tens of seconds of CPU: the slow suite runs it (issue 32)
def test_batch_size_finder_trials_run_unguarded_and_see_their_ooms() -> None:
    from lightning.pytorch.callbacks import BatchSizeFinder

    # A budget that fits a step of 64 items but not one of 128 (plus room for Lightning).
    budget = (_peak(64) + _peak(128)) // 2 + 64 * 1024
    rec = memfit.Recorder(None, log=False)
    model = Wide(batch_size=2)
    finder = BatchSizeFinder(mode="power", steps_per_trial=1, init_val=2, max_trials=10)
    with memfit.simulate_gpu(budget):
        _trainer([finder, mlight.MemfitCallback(rec)], steps=2).fit(model)
    guard = model._memfit_guard
    # The trials saw the out-of-memory at 128 (a guard would have split it and let the
    # finder pick 256): the finder chose what runs whole.
    assert finder.optimal_batch_size == 64 and model.batch_size == 64
    assert guard.trial_steps >= 5
    assert guard.splits == 1 and guard.steps == 2  # the trials left no trace in the guard
    assert all(e.kind != "split" for e in guard.events)


def test_guard_events_reach_the_recorder_attached_when_they_happen() -> None:
    rec = memfit.Recorder(None, log=False)
    model = Wide(batch_size=8)
    # 20%: enough faults in 4 steps whatever else the step allocates (the journal, issue 21)
    with memfit.testing.inject_oom(0.2, seed=0, where=("forward",)):
        _trainer([mlight.MemfitCallback(rec)], steps=4).fit(model)
    ooms = [e for e in model._memfit_guard.events if e.kind == "oom"]
    assert ooms and [e.kind for e in rec.events if e.kind == "oom"] == ["oom"] * len(ooms)


def test_accumulate_steps_once_per_k_batches_like_lightning_accumulation() -> None:
    torch.manual_seed(0)
    auto = Wide(batch_size=16, manual=False)
    pl.Trainer(
        max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=4,
        limit_train_batches=12,
    ).fit(auto)  # fmt: skip
    guarded = Wide(batch_size=16, accumulate=4)
    pl.Trainer(
        max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_train_batches=12,
    ).fit(guarded)  # fmt: skip
    assert guarded._memfit_guard.steps == 3
    assert [loss is None for loss in guarded.losses] == [True, True, True, False] * 3
    for a, b in zip(auto.parameters(), guarded.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_lightning_refuses_its_own_accumulation_with_manual_optimisation() -> None:
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    trainer = pl.Trainer(
        max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, accumulate_grad_batches=2,
    )  # fmt: skip
    with pytest.raises(MisconfigurationException, match="accumulation"):
        trainer.fit(Wide())
    with pytest.raises(ConfigError, match="accumulate"):
        _trainer([], steps=1).fit(_BadAccumulate())


class _BadAccumulate(Wide):
    def __init__(self) -> None:
        super().__init__(accumulate=0)
