"""memfit.integrations.transformers against the real Hugging Face Trainer (tiny GPT-2, CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import memfit
from memfit.errors import ConfigError, OutOfMemory
from memfit.integrations import transformers as mtf

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


class Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 50, (n, 12), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(tmp_path: Path, micro: int, accumulation: int, callbacks: list[Any]) -> Any:
    torch.manual_seed(0)
    config = tf.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
    model = tf.GPT2LMHeadModel(config)
    args = tf.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        max_steps=3,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    return tf.Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)


def _oom_above(model: Any, limit: int) -> list[int]:
    """Make the model run out of memory on micro-batches larger than ``limit`` items."""
    seen: list[int] = []
    forward = model.forward

    def guarded(*args: Any, **kwargs: Any) -> Any:
        n = kwargs["input_ids"].shape[0]
        seen.append(n)
        if n > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} MiB")
        return forward(*args, **kwargs)

    model.forward = guarded
    return seen


@pytest.mark.slow  # tens of seconds of CPU: the slow suite runs it (issue 32)
def test_train_halves_micro_batch_and_keeps_effective_batch(tmp_path: Path) -> None:
    rec = memfit.Recorder(None, log=False)
    trainer = _trainer(tmp_path, micro=16, accumulation=1, callbacks=[mtf.MemfitCallback(rec)])
    seen = _oom_above(trainer.model, 4)
    events: list[Any] = []
    out = mtf.train(trainer, on_event=events.append)
    args = trainer.args
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 4)
    assert trainer.state.global_step == 3 and out.global_step == 3
    assert seen[-1] == 4 and 16 in seen and 8 in seen
    assert [e.kind for e in events] == ["oom", "split", "oom", "split"]
    # The first failure came before any optimizer step: nothing to redo.
    assert events[-1].data == {
        "micro_batch": 4,
        "accumulation": 4,
        "resume_from": None,
        "steps_redone": 0,
    }
    assert [s["step"] for s in rec.samples] == [1, 2, 3]


def _exact_trainer(tmp_path: Path, micro: int, accumulation: int, **extra: Any) -> Any:
    """A 12-step run without dropout: micro-batches change only the rounding."""
    torch.manual_seed(0)
    config = tf.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = tf.GPT2LMHeadModel(config)
    settings: dict[str, Any] = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accumulation,
        "max_steps": 12,
        "report_to": [],
        "save_strategy": "no",
        "use_cpu": True,
        "disable_tqdm": True,
        "remove_unused_columns": False,
        "learning_rate": 1e-3,
        "seed": 0,
        **extra,
    }
    return tf.Trainer(model=model, args=tf.TrainingArguments(**settings), train_dataset=Tokens(256))


def _oom_from_step(trainer: Any, step: int, limit: int) -> list[int]:
    """Micro-batches over ``limit`` items run out of memory from optimizer step ``step`` on;
    returns the optimizer steps taken, in order, across attempts."""
    taken: list[int] = []
    forward = trainer.model.forward

    def guarded(*args: Any, **kwargs: Any) -> Any:
        if trainer.state.global_step >= step and kwargs["input_ids"].shape[0] > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")
        return forward(*args, **kwargs)

    class Count(tf.TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            taken.append(int(state.global_step))

    trainer.model.forward = guarded
    trainer.add_callback(Count())
    return taken


def _params(model: Any) -> list[Any]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.slow  # tens of seconds of CPU: the slow suite runs it (issue 32)
def test_a_restart_without_checkpoint_starts_over_from_the_start_exactly(tmp_path: Path) -> None:
    reference = _exact_trainer(tmp_path / "ref", micro=4, accumulation=2)
    reference.train()
    expected = _params(reference.model)

    trainer = _exact_trainer(tmp_path / "run", micro=8, accumulation=1)
    taken = _oom_from_step(trainer, 5, limit=4)
    events: list[Any] = []
    out = mtf.train(trainer, on_event=events.append)
    # Five optimizer steps ran at micro-batch 8 before the failure; the model then started
    # over from its first weights, a fresh optimizer and the same generators: 12 steps.
    assert taken == [1, 2, 3, 4, 5, *range(1, 13)]
    assert out.global_step == 12
    assert events[-1].data["steps_redone"] == 5 and events[-1].data["resume_from"] is None
    for p, q in zip(_params(trainer.model), expected, strict=True):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # tens of seconds of CPU: the slow suite runs it (issue 32)
def test_a_restart_resumes_from_the_checkpoint_this_call_wrote(tmp_path: Path) -> None:
    reference = _exact_trainer(tmp_path / "ref", micro=8, accumulation=1)
    reference.train()
    expected = _params(reference.model)

    trainer = _exact_trainer(
        tmp_path / "run", micro=8, accumulation=1, save_strategy="steps", save_steps=4
    )
    taken = _oom_from_step(trainer, 6, limit=4)
    events: list[Any] = []
    out = mtf.train(trainer, on_event=events.append)
    assert out.global_step == 12
    assert taken == [1, 2, 3, 4, 5, 6, *range(5, 13)]  # steps 5 and 6 are done again
    assert events[-1].data["resume_from"].endswith("checkpoint-4")
    for p, q in zip(_params(trainer.model), expected, strict=True):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6)


def test_restart_checkpoint_refuses_to_go_on_without_one(tmp_path: Path) -> None:
    trainer = _exact_trainer(tmp_path, micro=8, accumulation=1)
    _oom_from_step(trainer, 3, limit=4)
    with pytest.raises(OutOfMemory, match="no checkpoint to go on from") as info:
        mtf.train(trainer, restart="checkpoint")
    assert "save_strategy" in (info.value.hint or "")
    with pytest.raises(ConfigError, match="restart must be"):
        mtf.train(trainer, restart="never")


def test_auto_find_batch_size_is_refused_loudly(tmp_path: Path) -> None:
    trainer = _exact_trainer(tmp_path, micro=8, accumulation=1, auto_find_batch_size=True)
    with pytest.raises(ConfigError, match="effective batch") as info:
        mtf.train(trainer)
    assert info.value.key_path == "trainer.args.auto_find_batch_size"


def test_train_gives_up_at_micro_batch_one(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, micro=2, accumulation=2, callbacks=[])
    _oom_above(trainer.model, 0)
    with pytest.raises(OutOfMemory, match="micro-batch 1 x 4") as info:
        mtf.train(trainer)
    assert info.value.tried == ["micro-batch 1 x 4"]
    with pytest.raises(ConfigError, match="max_halvings"):
        mtf.train(trainer, max_halvings=-1)


def test_train_passes_other_errors_through(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, micro=2, accumulation=1, callbacks=[])

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("not memory")

    trainer.model.forward = broken
    with pytest.raises(ValueError, match="not memory"):
        mtf.train(trainer)


def test_apply_batch_keeps_the_effective_batch() -> None:
    args = tf.TrainingArguments(
        output_dir="unused", per_device_train_batch_size=12, gradient_accumulation_steps=2,
        report_to=[], use_cpu=True,
    )  # fmt: skip
    assert mtf.apply_batch(args, 5) == (4, 6)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 24


def test_callback_is_a_trainer_callback_and_logs_memory() -> None:
    cb = mtf.MemfitCallback(memfit.Recorder(None, log=False))
    assert isinstance(cb, tf.TrainerCallback)
    cb.last_sample = {"allocated_bytes": 10, "peak_allocated_bytes": 20, "reserved_bytes": None}
    logs: dict[str, Any] = {}
    cb.on_log(None, None, None, logs=logs)
    assert logs == {"memfit/allocated_bytes": 10, "memfit/peak_allocated_bytes": 20}
