"""Does an operator run differently on CUDA than on the CPU? Asked of the installed torch.

A composite operator (one with a ``CompositeImplicitAutograd`` kernel: ``dropout``,
``scaled_dot_product_attention``, ``batch_norm``, ``linear``, ...) is decomposed into other
operators above autograd, and some of them branch on the device: CUDA's ``dropout`` calls the
fused ``native_dropout`` (output and a 1-byte mask, which its backward keeps) where the CPU
draws a noise tensor of the input's dtype and multiplies (the noise is what backward keeps).
Such a branch is invisible to a trace on the CPU, which only ever takes the CPU's.

:func:`read_rule` asks the installed torch directly: the same call runs on fake CUDA tensors
and on fake CPU tensors of the same shapes (no gradient: autograd on a fake CUDA tensor
aborts a torch built without CUDA), each under a recording dispatch mode, and the operators
each one reaches are compared. Where they are the same (almost always) the call is traced as
it is. Where CUDA's decomposition is a single operator whose result is the call's result (or
one of its outputs), the rule is to call that operator on the traced tensors: its fake
kernel gives CUDA's shapes, and its derivative formula saves what CUDA's backward keeps.
Any other difference is reported (:attr:`CudaDecomposition.kind` ``"differs"``) and traced
the CPU's way. No list of operators is copied here: a torch that changes a decomposition changes the
rule. Rules are cached per operator and argument pattern for the process.

What a torch built without CUDA cannot show: branches on libraries only CUDA builds link
(cuDNN's batch norm and RNNs, FlashAttention's availability), which answer "not available"
on fake CUDA tensors; ``scaled_dot_product_attention``'s choice is therefore modelled
(:mod:`memfit.estimate.torch._cuda_sdpa`), and the others are listed in the estimate's notes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from memfit.estimate.torch._autocast import METADATA_QUERIES
from memfit.estimate.torch._fake_compat import op_name

__all__ = [
    "CudaDecomposition",
    "apply_rule",
    "composite_op_names",
    "decompose",
    "in_cpu_probe",
    "is_probing",
    "pattern",
    "probing",
    "read_rule",
    "rule_for",
]

_NAMES: tuple[str, ...] | None = None
_PROBING = threading.local()
# Rules read in this process: (operator, grad mode, argument pattern) -> CudaDecomposition.
_RULES: dict[tuple[Any, ...], CudaDecomposition] = {}
_LOCK = threading.Lock()
_QUERIES = METADATA_QUERIES | {"detach"}


def composite_op_names() -> tuple[str, ...]:
    """ATen operators with a ``CompositeImplicitAutograd`` kernel in the installed torch."""
    global _NAMES
    with _LOCK:
        if _NAMES is None:
            _NAMES = tuple(
                sorted(
                    name
                    for name in torch._C._dispatch_get_all_op_names()
                    if name.startswith("aten::")
                    and torch._C._dispatch_has_kernel_for_dispatch_key(
                        name, "CompositeImplicitAutograd"
                    )
                )
            )
        return _NAMES


def decompose(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``op``'s C++ ``CompositeImplicitAutograd`` kernel, as the dispatcher does at the
    autograd key (not the Python decompositions torch registers for tracing, which may
    differ: torch's Python ``dropout`` calls ``native_dropout`` on every device)."""
    return op._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)


@dataclass(frozen=True)
class CudaDecomposition:
    """What a CUDA target does with one composite call pattern.

    Attributes:
        kind: ``"same"`` (both devices decompose alike), ``"direct"`` (CUDA runs the one
            operator ``target``), ``"differs"`` (CUDA decomposes otherwise; traced the CPU's
            way and reported) or ``"unread"`` (the probe could not run).
        target: The operator CUDA runs, for ``"direct"``.
        template: ``(args, kwargs)`` of that call, with ``("arg", i)`` for the i-th flattened
            argument of the composite call.
        index: Which output of ``target`` is the call's result (``None``: all of it).
        cuda_ops: The operators CUDA's decomposition reaches (for reports).
        cpu_ops: The operators the CPU's reaches.
    """

    kind: str
    target: Any = None
    template: Any = None
    index: int | None = None
    cuda_ops: tuple[str, ...] = ()
    cpu_ops: tuple[str, ...] = ()


class _Ref:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def pattern(value: Any) -> Any:
    """A hashable description of an argument that decides how a composite decomposes: a
    tensor's dtype, rank, emptiness and contiguity (not its shape), any other value as is."""
    if isinstance(value, torch.Tensor):
        return (
            "T",
            value.dtype,
            value.dim(),
            value.numel() == 0,
            value.is_contiguous(),
            value.layout,
        )
    if isinstance(value, (list, tuple)):
        return tuple(pattern(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, pattern(v)) for k, v in value.items()))
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return value
    if isinstance(value, (torch.device, torch.memory_format, torch.layout)):
        return str(value)
    return type(value).__name__


class _Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records each operator a call reaches: its name, the outputs' dtypes and shapes, and
    the call itself (for the single-operator rule)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: list[tuple[str, tuple[Any, ...]]] = []
        self.calls: list[tuple[Any, Any, Any, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "prim" or func.overloadpacket.__name__ in _QUERIES:
            return out
        outs = tuple(
            (t.dtype, tuple(t.shape)) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)
        )
        self.seen.append((str(func), outs))
        self.calls.append((func, args, kwargs, out))
        return out


_AUTOCAST_KEYS = (
    "AutocastCPU",
    "AutocastCUDA",
    "AutocastPrivateUse1",
    "AutocastHPU",
    "AutocastIPU",
    "AutocastXPU",
    "AutocastMPS",
)


@contextmanager
def probing(*, grad: bool = False, cpu_side: bool = False) -> Iterator[Any]:
    """Outside the trace: no modes, no autocast; yields a fake mode of its own.

    Args:
        grad: Keep gradient mode on (for fake CPU tensors only: autograd on a fake CUDA
            tensor aborts a torch built without CUDA).
        cpu_side: The probe runs the CPU's decomposition; composite calls nested in it
            follow their rules (:func:`apply_rule`), as they do in the trace.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _disable_current_modes

    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    for name in _AUTOCAST_KEYS:
        key = getattr(torch._C.DispatchKey, name, None)
        if key is not None:
            keys = keys | torch._C.DispatchKeySet(key)
    depth = getattr(_PROBING, "depth", 0)
    side = getattr(_PROBING, "cpu_side", False)
    _PROBING.depth = depth + 1
    _PROBING.cpu_side = cpu_side
    try:
        with (
            _disable_current_modes(),
            torch._C.DisableTorchFunction(),
            torch._C._ExcludeDispatchKeyGuard(keys),
            torch.set_grad_enabled(grad),
            _own_saved_tensors_hooks(),
        ):
            yield FakeTensorMode()
    finally:
        _PROBING.depth = depth
        _PROBING.cpu_side = side


@contextmanager
def _own_saved_tensors_hooks() -> Iterator[None]:
    """Identity hooks on top of the stack, so that what the probe's autograd saves does not
    reach the user's hooks (``torch.utils.checkpoint`` counts the tensors saved in the
    forward and compares them with its recomputation's)."""
    if torch._C._autograd._saved_tensors_hooks_is_enabled():  # type: ignore[attr-defined]
        with torch.autograd.graph.saved_tensors_hooks(_same, _same):
            yield
    else:  # hooks are switched off here (a reentrant checkpoint): nothing can reach them
        yield


def _same(tensor: Any) -> Any:
    return tensor


def is_probing() -> bool:
    """Whether this thread is inside :func:`probing` (the trace's kernels stand aside)."""
    return bool(getattr(_PROBING, "depth", 0))


def in_cpu_probe() -> bool:
    """Whether this thread runs the CPU side of a probe (nested composites follow rules)."""
    return bool(getattr(_PROBING, "cpu_side", False))


def _shadow(mode: Any, value: Any, device: str, grad: bool) -> Any:
    if isinstance(value, torch.device) and value.type == "cpu":
        return torch.device(device)  # the traced device, named in an argument (``.to(dev)``)
    if not isinstance(value, torch.Tensor):
        return value
    with mode:
        out = torch.empty_strided(
            tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device=device
        )
    if grad and value.requires_grad and (out.is_floating_point() or out.is_complex()):
        out.requires_grad_(True)
    return out


def _observe(
    op: Any, leaves: list[Any], spec: Any, device: str, *, grad: bool | None = None
) -> _Recorder:
    """Run ``op``'s composite kernel on shadows of ``leaves`` on ``device`` and record what
    it reaches. The CPU side keeps the call's gradient mode and flags (the CPU's
    decomposition may depend on them) unless ``grad`` says otherwise; the CUDA side runs
    without gradient."""
    if grad is None:
        grad = device == "cpu" and torch.is_grad_enabled()
    with probing(grad=grad, cpu_side=device == "cpu") as mode:
        shadows = [_shadow(mode, v, device, grad) for v in leaves]
        args, kwargs = tree_unflatten(shadows, spec)
        recorder = _Recorder()
        with mode, recorder:
            result = decompose(op, *args, **kwargs)
    recorder.result = result  # type: ignore[attr-defined]
    recorder.shadows = shadows  # type: ignore[attr-defined]
    return recorder


def _template(value: Any, ids: dict[int, int], values: list[Any]) -> Any:
    """``value`` with the composite's tensors (by identity) and its other arguments (by
    equal value, where exactly one matches) as references; raises ``LookupError`` for a
    tensor the decomposition made itself."""
    if isinstance(value, torch.Tensor):
        if id(value) in ids:
            return _Ref(ids[id(value)])
        raise LookupError("a tensor the decomposition made")
    if isinstance(value, (list, tuple)):
        return type(value)(_template(v, ids, values) for v in value)
    if isinstance(value, (bool, int, float)) and not isinstance(value, torch.Tensor):
        same = [
            i
            for i, v in enumerate(values)
            if type(v) is type(value) and not isinstance(v, torch.Tensor) and v == value
        ]
        if len(same) == 1:
            return _Ref(same[0])
    return value


def fill(value: Any, leaves: list[Any]) -> Any:
    """A rule's template with the call's flattened arguments put back."""
    if isinstance(value, _Ref):
        return leaves[value.index]
    if isinstance(value, (list, tuple)):
        return type(value)(fill(v, leaves) for v in value)
    if isinstance(value, dict):
        return {k: fill(v, leaves) for k, v in value.items()}
    return value


def read_rule(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CudaDecomposition:
    """Compare ``op``'s decomposition on fake CUDA and fake CPU tensors (see the module
    docstring) and return the rule for this call's pattern."""
    leaves, spec = tree_flatten((args, kwargs))
    try:
        cpu = _observe(op, leaves, spec, "cpu")
    except Exception:  # fake tensors cannot run it at all (it reads values): no device says
        return CudaDecomposition("same")
    try:
        cuda = _observe(op, leaves, spec, "cuda")
    except Exception as exc:  # the CUDA path needs what a CPU build lacks
        if "not linked with support for cuda" in str(exc):
            # a device guard (moving data to the device the call names: ``.to(device)``),
            # not a kernel choice: both devices copy or return alike
            return CudaDecomposition("same")
        return CudaDecomposition("unread")
    cuda_ops = tuple(name for name, _ in cuda.seen)
    cpu_ops = tuple(name for name, _ in cpu.seen)
    if cuda.seen == cpu.seen:
        return CudaDecomposition("same")
    if torch.is_grad_enabled() and _observe(op, leaves, spec, "cpu", grad=False).seen == cuda.seen:
        # the CPU without gradient decomposes as CUDA did (which the probe runs without):
        # the difference is the gradient's (matmul folds differently), not the device's
        return CudaDecomposition("same")
    if len(cuda.calls) == 1:
        func, call_args, call_kwargs, out = cuda.calls[0]
        result = cuda.result  # type: ignore[attr-defined]
        index: int | None = None
        if out is not result:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            index = next((i for i, o in enumerate(outs) if o is result), None)
            if index is None:
                return CudaDecomposition("differs", cuda_ops=cuda_ops, cpu_ops=cpu_ops)
        shadows = cuda.shadows  # type: ignore[attr-defined]
        ids = {id(v): i for i, v in enumerate(shadows) if isinstance(v, torch.Tensor)}
        try:
            template = (
                _template(tuple(call_args), ids, shadows),
                {k: _template(v, ids, shadows) for k, v in call_kwargs.items()},
            )
        except LookupError:
            return CudaDecomposition("differs", cuda_ops=cuda_ops, cpu_ops=cpu_ops)
        return CudaDecomposition("direct", func, template, index, cuda_ops, cpu_ops)
    return CudaDecomposition("differs", cuda_ops=cuda_ops, cpu_ops=cpu_ops)


def rule_for(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CudaDecomposition:
    """The rule for this call's pattern, read once per process."""
    leaves = tree_flatten((args, kwargs))[0]
    key = (op_name(op), torch.is_grad_enabled(), tuple(pattern(v) for v in leaves))
    rule = _RULES.get(key)
    if rule is None:
        rule = read_rule(op, args, kwargs)
        _RULES[key] = rule
    return rule


def apply_rule(
    op: Any, rule: CudaDecomposition, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run the call as the rule says: CUDA's one operator (``"direct"``), else the
    composite's own decomposition. Returns ``(result, full output of the operator run)``."""
    if rule.kind != "direct":
        out = decompose(op, *args, **kwargs)
        return out, out
    leaves = tree_flatten((args, kwargs))[0]
    call_args, call_kwargs = fill(rule.template, leaves)
    out = rule.target(*call_args, **call_kwargs)
    return (out if rule.index is None else out[rule.index]), out
