"""What ordinary model code does that fake tensors refuse, made to work inside a trace.

* ``module.to(device)`` (every stable-baselines3 policy, the common ``Model().to(device)``):
  ``nn.Module._apply`` swaps each fake parameter with ``torch.utils.swap_tensors``, which
  refuses any tensor with a weak reference, and torch 2.13 keeps a weak reference to every
  fake tensor it makes (``fake_tensor_tls.non_strict_export_fake_tensor_tracker``). Inside a
  trace the swap of two fake tensors is done by ``t1.data = t2`` instead: the parameter
  object keeps its identity (optimizers built before the move still see it) and takes the
  converted storage, as the set-data path of ``_apply`` does for real tensors.
* Values read to Python: an initialiser such as ``nn.init.trunc_normal_`` calls ``.item()``
  while it samples, and libraries' training loops read losses for logging. In ``build()``,
  and inside :func:`memfit.estimate.stand_in_scalars` in the step, a read that fake tensors
  cannot answer gives zero of the tensor's type instead of failing; ``.numpy()`` gives zeros
  of the tensor's shape.
* A CUDA device named explicitly (``.cuda()``, ``.to("cuda")``, ``device="cuda"``) while the
  trace runs on the CPU (a machine without CUDA) is traced on the CPU, where the rest of the
  step is.
* ``copy.deepcopy`` of a fake tensor (target networks, cloned layers) is a fresh tensor of the
  same shape in the same fake mode (see :class:`TraceFunctionMode`).
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from memfit.estimate import stand_in_scalars_active

__all__ = [
    "MAX_STAND_INS",
    "TraceFunctionMode",
    "fake_swap_tensors",
    "locate_failure",
    "op_name",
    "scalar_stand_in",
]

#: Stand-in reads one trace may make before it is taken for a loop that waits on a value.
MAX_STAND_INS = 100_000


# str() of each operator the trace has met: the tracer and the CUDA target's kernels name
# every op they see (tens of thousands per traced step), and torch formats the name anew each
# time.
_OP_NAMES: dict[Any, str] = {}


def op_name(func: Any) -> str:
    """``str(func)`` (``"aten.add.Tensor"``), formatted once per operator for the process."""
    try:
        return _OP_NAMES[func]
    except KeyError:
        name = _OP_NAMES[func] = str(func)
        return name
    except TypeError:  # not hashable: no cache
        return str(func)


def scalar_stand_in(dtype: torch.dtype) -> bool | int | float | complex:
    """Zero of the Python type ``.item()`` returns for ``dtype``."""
    if dtype == torch.bool:
        return False
    if dtype.is_complex:
        return 0j
    if dtype.is_floating_point:
        return 0.0
    return 0


@contextmanager
def fake_swap_tensors() -> Iterator[None]:
    """``torch.utils.swap_tensors`` that also works on two fake tensors, while inside."""
    from torch._subclasses.fake_tensor import FakeTensor

    original: Callable[[torch.Tensor, torch.Tensor], None] = torch.utils.swap_tensors

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        if isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor):
            with torch.no_grad():
                t1.data = t2
            return
        original(t1, t2)

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":", 1)[0] == "cuda"
    return False


def _any_cuda(args: Any) -> bool:
    """Whether any of ``args`` names a CUDA device (a ``torch.device`` or a string)."""
    return any(isinstance(a, _DEVICE_LIKE) and _is_cuda(a) for a in args)


def _is_fake(value: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor)


_DEVICE_LIKE = (torch.device, str)
_DEEPCOPY = torch.Tensor.__deepcopy__
_NUMPY = torch.Tensor.numpy


class TraceFunctionMode(TorchFunctionMode):
    """The Python-level fixes a trace needs (see the module docstring).

    Args:
        retarget_cuda: Trace explicit CUDA devices on the CPU (set when the trace runs on
            the CPU).
        on_stand_in: Called once per value read given a stand-in (for the count and limit).
    """

    def __init__(self, *, retarget_cuda: bool, on_stand_in: Callable[[], None]) -> None:
        super().__init__()
        self.retarget_cuda = retarget_cuda
        self.on_stand_in = on_stand_in
        self.stand_ins_allowed = False  # build() sets it: initialisers read values
        self.retargeted = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if (func is _DEEPCOPY or func is _NUMPY) and _is_fake(args[0]):
            if func is _DEEPCOPY:
                return _fake_deepcopy(args[0], args[1])
            if self.stand_ins_allowed or stand_in_scalars_active():
                import numpy as np

                self.on_stand_in()
                tensor = args[0]
                return np.zeros(tuple(tensor.shape), dtype=_numpy_dtype(tensor.dtype))
        if self.retarget_cuda:
            if func is torch.Tensor.cuda:
                self.retargeted += 1
                return args[0]
            if _any_cuda(args) or _is_cuda(kwargs.get("device")):
                self.retargeted += 1
                args = tuple("cpu" if _is_cuda(a) else a for a in args)
                if _is_cuda(kwargs.get("device")):
                    kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


def _numpy_dtype(dtype: torch.dtype) -> Any:
    """The numpy dtype ``.numpy()`` gives for ``dtype`` (float32 for those numpy lacks)."""
    import numpy as np

    name = str(dtype).removeprefix("torch.")
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16, float8: numpy has no such type
        return np.dtype(np.float32)


def _fake_deepcopy(tensor: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy`` of a fake tensor inside the trace's own fake mode.

    ``Tensor.__deepcopy__`` copies the storage by a path that gives the copy a new fake mode,
    which the next op refuses ("Mixing fake modes"); modules cloned in ``__init__``
    (``nn.TransformerEncoder``) or target networks made with ``deepcopy`` would break the
    trace. Here the copy is a fresh tensor of the same shape, strides and dtype in the same
    mode, so its storage is allocated (and counted) as a real deepcopy allocates it.
    """
    if id(tensor) in memo:
        return memo[id(tensor)]
    with torch.no_grad():
        data = torch.empty_strided(
            tensor.size(), tensor.stride(), dtype=tensor.dtype, device=tensor.device
        )
    out: torch.Tensor
    if isinstance(tensor, torch.nn.Parameter):
        out = torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
    else:
        out = data.requires_grad_(tensor.requires_grad)
    memo[id(tensor)] = out
    return out


# --- Where a failure happened -------------------------------------------------------------------


def _roots() -> tuple[str, str, tuple[str, ...]]:
    memfit_root = str(Path(__file__).resolve().parents[2]) + os.sep
    torch_root = str(Path(torch.__file__).resolve().parent) + os.sep
    stdlib = tuple(
        str(Path(p).resolve()) + os.sep
        for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
    )
    return memfit_root, torch_root, stdlib


def _kind(filename: str, roots: tuple[str, str, tuple[str, ...]]) -> str:
    memfit_root, torch_root, stdlib = roots
    try:
        path = str(Path(filename).resolve())
    except OSError:  # pragma: no cover - a frame of a file that went away
        path = filename
    if path.startswith(torch_root):
        return "torch"
    if path.startswith(memfit_root):
        return "memfit"
    parts = Path(path).parts
    if "site-packages" in parts or "dist-packages" in parts:
        return "library"
    if path.startswith(stdlib) or filename.startswith("<frozen"):
        return "stdlib"
    return "user"


def _short(filename: str) -> str:
    parts = Path(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    try:
        return os.path.relpath(filename)
    except ValueError:  # pragma: no cover - another drive on Windows
        return filename


def locate_failure(exc: BaseException, entry: str) -> tuple[str | None, bool]:
    """Where ``exc`` left the user's (or a library's) code, as ``file:line (function)``.

    Args:
        exc: The exception raised while tracing.
        entry: The name of the memfit function that called the user's callable; frames
            before it are memfit's own.

    Returns:
        ``(where, in_library)``: ``where`` names the innermost frame that is neither torch
        nor memfit nor the standard library, and, when that frame is in an installed
        library, the user's line that called into it (``None`` when there is no such
        frame); ``in_library`` says the failing call is in an installed library.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    start = 0
    for index, frame in enumerate(frames):
        if frame.name == entry:
            start = index + 1
    roots = _roots()
    kinds = [(_kind(f.filename, roots), f) for f in frames[start:]]
    own = [(k, f) for k, f in kinds if k in ("library", "user")]
    if not own:
        return None, False
    kind, failing = own[-1]
    where = f"{_short(failing.filename)}:{failing.lineno} ({failing.name})"
    if kind == "library":
        users = [f for k, f in own if k == "user"]
        if users:
            caller = users[-1]
            where += f", called from {_short(caller.filename)}:{caller.lineno} ({caller.name})"
        return where, True
    return where, False
