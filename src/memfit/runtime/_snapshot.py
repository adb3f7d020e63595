"""What ``optimizer.step()`` changes, kept so that a failed step can be undone.

:class:`OptimizerSnapshot` copies parameters and optimizer state to host buffers reused from
step to step; :func:`step_fingerprint` is the cheap alternative, telling only whether a failed
step changed anything at all (the version counters of the tensors and the state's keys).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from memfit.errors import ConfigError
from memfit.runtime.oom import no_alloc_section

if TYPE_CHECKING:
    import torch

__all__ = [
    "Fingerprint",
    "OptimizerSnapshot",
    "copy_all",
    "step_fingerprint",
    "undo_if_untouched",
    "versions_trustworthy",
]

_PLAIN = (int, float, bool, complex, str, type(None))


class OptimizerSnapshot:
    """Parameters and optimizer state copied to host buffers reused from step to step.

    Policy: the copy lives in host memory (pinned when the tensors are on CUDA), so taking it
    never costs device memory; under :func:`memfit.simulate_gpu` it is not counted either.
    The buffers are allocated once and refilled with one ``_foreach_copy_`` per step while
    the set of tensors stays the same (it changes when the optimizer creates its state on
    the first step). Group hyper-parameters are kept by value (a tensor-valued one by
    reference: ``optimizer.step()`` does not change them).
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._src: list[torch.Tensor] = []
        self._dst: list[torch.Tensor] = []
        self._slots: list[tuple[torch.Tensor, str | None]] = []  # (param, state key or None)
        self._params: list[torch.Tensor] = []
        self._state_keys: dict[int, tuple[str, ...]] = {}
        self._plain: list[tuple[torch.Tensor, str, Any]] = []
        self._groups: list[dict[str, Any]] = []
        self._on_host = True

    def take(self) -> None:
        """Copy parameters, optimizer state and hyper-parameters to host memory.

        Raises:
            ConfigError: When the optimizer state holds a value memfit cannot copy.
        """
        import torch

        opt = self.optimizer
        state = opt.state
        tensor_type = torch.Tensor
        src: list[torch.Tensor] = []
        slots: list[tuple[torch.Tensor, str | None]] = []
        params: list[torch.Tensor] = []
        plain: list[tuple[torch.Tensor, str, Any]] = []
        state_keys: dict[int, tuple[str, ...]] = {}
        for group in opt.param_groups:
            for p in group["params"]:
                params.append(p)
                src.append(p)
                slots.append((p, None))
                st = state.get(p)
                if st is None:
                    continue
                state_keys[id(p)] = tuple(st)
                for key, value in st.items():
                    if isinstance(value, tensor_type):
                        src.append(value)
                        slots.append((p, key))
                    elif isinstance(value, _PLAIN):
                        plain.append((p, key, value))
                    else:
                        raise ConfigError(
                            f"optimizer state {key!r} of {type(opt).__name__} is a "
                            f"{type(value).__name__}, which memfit cannot snapshot",
                            key_path="optimizer",
                            hint="pass snapshot_optimizer='never' to TrainGuard; an "
                            "out-of-memory inside optimizer.step() then stops the run "
                            "with memfit.OutOfMemory instead of retrying",
                        )
        same = len(src) == len(self._src) and all(
            a is b for a, b in zip(src, self._src, strict=True)
        )
        if not same:
            self._dst = self._host_buffers(src)
            self._src = src
            self._slots = slots
            self._on_host = all(not t.is_cuda for t in src)
        self._params = params
        self._plain = plain
        self._state_keys = state_keys
        self._groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        with torch.no_grad():
            if self._on_host:
                torch._foreach_copy_(self._dst, self._src)
            else:
                copy_all(self._dst, self._src)

    @staticmethod
    def _host_buffers(src: list[torch.Tensor]) -> list[torch.Tensor]:
        import torch

        from memfit.runtime.simulate import active

        gpu = active()
        ctx: AbstractContextManager[None] = gpu.paused() if gpu is not None else nullcontext()
        with ctx:
            return [
                torch.empty(
                    t.shape,
                    dtype=t.dtype,
                    device="cpu",
                    pin_memory=bool(t.is_cuda and torch.cuda.is_available()),
                )
                for t in src
            ]

    def restore(self) -> None:
        """Put parameters, optimizer state and hyper-parameters back as :meth:`take` saw them."""
        import torch

        opt = self.optimizer
        for group, saved in zip(opt.param_groups, self._groups, strict=True):
            group.update(saved)
        for p in self._params:
            keys = self._state_keys.get(id(p))
            if keys is None:
                opt.state.pop(p, None)  # the failed step created it
                continue
            st = opt.state[p]
            for key in [k for k in st if k not in keys]:
                del st[key]
        for p, key, value in self._plain:
            opt.state[p][key] = value
        dst: list[torch.Tensor] = []
        src: list[torch.Tensor] = []
        with torch.no_grad():
            for (p, key), original, buf in zip(self._slots, self._src, self._dst, strict=True):
                if key is None:
                    dst.append(p)
                    src.append(buf)
                    continue
                st = opt.state[p]
                current = st.get(key)
                if current is not original:
                    # The failed step replaced the tensor: put the original object back.
                    st[key] = original
                dst.append(original)
                src.append(buf)
            with no_alloc_section():
                copy_all(dst, src)


def copy_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for all i: one foreach op on one device, else per tensor."""
    import torch

    if not dst:
        return
    if all(d.device == s.device for d, s in zip(dst, src, strict=True)):
        torch._foreach_copy_(dst, src)
        return
    for d, s in zip(dst, src, strict=True):
        d.copy_(s, non_blocking=True)
    if any(t.is_cuda for t in dst) or any(t.is_cuda for t in src):
        torch.cuda.synchronize()


Fingerprint = tuple[list[int], list[Any], list[tuple[int, int]]]


def step_fingerprint(optimizer: torch.optim.Optimizer) -> Fingerprint:
    """The version counters of the parameters, the keys of their state, and the identity and
    version counter of every state tensor.

    Every in-place change of a tensor raises its version counter, so a failed
    ``optimizer.step()`` whose fingerprint still matches changed nothing and can be run again
    without a snapshot (:func:`undo_if_untouched`). Reading it costs a few microseconds.
    """
    import torch

    tensor = torch.Tensor
    state = optimizer.state
    params = [p for group in optimizer.param_groups for p in group["params"]]
    states = [state.get(p) for p in params]
    return (
        [p._version for p in params],
        [tuple(st) if st else None for st in states],
        [
            (id(v), v._version if isinstance(v, tensor) else -1)
            for st in states
            if st
            for v in st.values()
        ],
    )


def versions_trustworthy() -> bool:
    """Whether in-place operations raise version counters now.

    Under a ``TorchDispatchMode`` (a profiler-like mode, a debugging mode) they do not, so a
    fingerprint cannot tell a step that changed nothing from one that changed everything;
    memfit's own :func:`memfit.testing.inject_oom` raises them itself.
    """
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return all(
        getattr(mode, "keeps_versions", False) for mode in _get_current_dispatch_mode_stack()
    )


def undo_if_untouched(optimizer: torch.optim.Optimizer, before: Fingerprint) -> bool:
    """After a failed step: whether it changed nothing that existed before it.

    State the failed step created for a parameter that had none, while leaving every
    parameter and every existing state tensor untouched, is removed (the retry creates it
    again). Plain numbers in the state (a ``step`` count kept as an int) are not covered by
    version counters: a state holding one counts as touched.

    Returns:
        ``True`` when the step can be run again as if it had never started.
    """
    versions, keys, tensors = before
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if [p._version for p in params] != versions or any(v < 0 for _, v in tensors):
        return False
    state = optimizer.state
    fresh: list[Any] = []
    for p, had in zip(params, keys, strict=True):
        st = state.get(p)
        if had is None:
            if st:
                fresh.append(p)
        elif st is None or tuple(st) != had:
            return False
    import torch

    now = [
        (id(v), v._version if isinstance(v, torch.Tensor) else -1)
        for p, had in zip(params, keys, strict=True)
        if had is not None
        for v in state[p].values()
    ]
    if now != tensors:
        return False
    for p in fresh:
        state.pop(p, None)
    return True
