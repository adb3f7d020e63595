"""CUDA's autocast rules in a trace that runs on the CPU.

A step written for a GPU runs its forward under ``torch.autocast("cuda", dtype=...)`` (or
``torch.cuda.amp.autocast``, ``torch.amp.autocast(device_type="cuda")``) and scales its loss
with ``GradScaler("cuda")``. In a trace on a CPU-only torch both switch themselves off ("CUDA
is not available"), so every op runs in float32; and even where autocast runs, the CPU's rules
are not CUDA's (CUDA keeps ``layer_norm``, ``softmax`` and the losses in float32, casts matmuls
and convolutions down, promotes mixed inputs of ``addcmul``/``index_put``/..., and caches the
low-precision copy of each weight for the whole autocast region).

:class:`CudaAutocast` makes such a step trace as on the GPU:

* ``torch.autocast("cuda")`` and ``GradScaler("cuda")`` are let through (the check that turns
  them off answers "available", and ``torch.cuda.is_bf16_supported()`` answers ``True``), so
  the region sets torch's own CUDA autocast state (``torch.is_autocast_enabled("cuda")``,
  nesting, the cache flag) exactly as on the GPU.
* Every operator with a CUDA autocast kernel in the installed torch (read from its dispatcher:
  the operators with a kernel for the ``AutocastCUDA`` key) gets a Python kernel for an
  autocast key that nothing else uses on this machine (``AutocastPrivateUse1`` on a CPU
  build, given a fallthrough for the other operators), and that key is switched on for the
  trace's thread. The kernel does nothing unless CUDA autocast is on. When it is, it asks
  torch's own ``AutocastCUDA`` kernel what it does with these arguments: the same call, on
  fake CUDA tensors of the same shapes and dtypes (no gradient: autograd on a fake CUDA
  tensor aborts a torch built without CUDA), runs through that kernel under a recording
  dispatch mode, which sees the casts it makes and the call it passes on, and stops there.
  The rule is then whichever of "cast these arguments to these dtypes", "set the ``dtype``
  argument to float32", "call the overload that takes a dtype" or "refuse" reproduces that
  observation exactly (checked by running the candidate the same way without autocast); it
  is cached per operator and argument dtypes, and applied to the traced tensors (above
  autograd, as the real kernel is, so the backward pass sees the same dtypes). Where the
  CPU's decomposition of the result then differs from CUDA's and CUDA runs one operator
  (``softmax`` of float16 to float32 is ``_softmax(half_to_float=True)`` on CUDA only), that
  operator is called instead. No list of operators or policies is copied here: a torch that
  moves an operator between lists moves it in the trace too.
* Casts to the autocast dtype of float32 leaves that require grad (the parameters) are cached
  as ``at::autocast::cached_cast`` caches them (the same condition: leaf, requires grad, not a
  view, cache enabled) and dropped when torch clears its autocast cache, which
  ``autocast.__exit__`` does when the outermost region ends; the trace sees those copies live
  until then, and freed then (or later, when the autograd graph still holds them).
* ``GradScaler.step`` reads the found-inf flags with ``.item()``; under the trace that read
  is given a stand-in (0: no overflow), so the step is taken as it is on most real steps.

What stays the CPU's way is listed by :meth:`CudaAutocast.notes`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from memfit.units import format_bytes

__all__ = ["CudaAutocast", "cuda_autocast_op_names"]

# Autocast keys that may stand in for CUDA's on CPU tensors, in order of preference: one
# that no operator we take over has a kernel for (XPU's has its own list in a CPU build) and
# that has no fallback yet (we register a fallthrough for the operators we leave alone, as
# autocast_mode.cpp does for the keys it uses).
_CANDIDATE_KEYS = ("AutocastPrivateUse1", "AutocastHPU", "AutocastIPU")

#: Metadata queries a recording lets through (they do not run the operator); the composite
#: probe (:mod:`memfit.estimate.torch._cuda_probe`) lets ``detach`` through too.
METADATA_QUERIES = frozenset(
    {
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_contiguous",
        "is_strides_like_format",
        "is_non_overlapping_and_dense",
    }
)

_OP_NAMES: tuple[str, ...] | None = None
# Rules read so far in this process: (operator, autocast dtype, argument pattern, keyword
# names) -> rule. The installed torch does not change while the process runs.
_RULES: dict[tuple[Any, ...], _Rule] = {}
_OP_NAMES_LOCK = threading.Lock()


def cuda_autocast_op_names() -> tuple[str, ...]:
    """Operators with a CUDA autocast kernel in the installed torch (``"aten::mm"``,
    ``"aten::softmax.int"``), read from its dispatcher."""
    global _OP_NAMES
    with _OP_NAMES_LOCK:
        if _OP_NAMES is None:
            _OP_NAMES = tuple(
                sorted(
                    name
                    for name in torch._C._dispatch_get_all_op_names()
                    if name.startswith("aten::")
                    and torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCUDA")
                )
            )
        return _OP_NAMES


def _overload(name: str) -> Any:
    """The ``torch.ops`` overload for ``"aten::name.overload"``, or ``None``."""
    base, _, overload = name.removeprefix("aten::").partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _emulation_key(names: tuple[str, ...]) -> str | None:
    """An autocast dispatch key this torch leaves free for the emulation, or ``None``."""
    for key_name in _CANDIDATE_KEYS:
        key = getattr(torch._C.DispatchKey, key_name, None)
        if key is None or torch._C._dispatch_has_backend_fallback(key):
            continue
        if not torch._C._dispatch_tls_is_dispatch_key_excluded(key):
            continue  # switched on already (a real device of that kind is autocasting)
        if any(torch._C._dispatch_has_kernel_for_dispatch_key(n, key_name) for n in names):
            continue
        return key_name
    return None


class _Stop(Exception):
    """Raised by the recorder once it has seen the call the autocast kernel passes on."""


def _describe(value: Any, originals: dict[int, int]) -> Any:
    """A comparable description of an argument of a recorded call."""
    if isinstance(value, torch.Tensor):
        index = originals.get(id(value))
        if index is not None:
            return ("arg", index)
        return ("tensor", value.dtype, tuple(value.shape))
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v, originals) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _describe(v, originals)) for k, v in value.items()))
    if isinstance(value, (int, float, bool, str, torch.dtype, torch.device)) or value is None:
        return value
    return type(value).__name__


class _Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the casts of the original arguments and the first other call, then stops.

    With ``whole``, it lets that call run and stops at a second one instead; ``call`` is
    then the only operator the op ran (``(func, args, kwargs, output)``) if it ran one.
    """

    def __init__(self, originals: dict[int, int], *, whole: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.originals = originals
        self.whole = whole
        self.events: list[tuple[Any, ...]] = []
        self.cast_outputs: dict[int, int] = {}  # id(cast result) -> argument index
        self.call: tuple[Any, Any, Any, Any] | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace == "prim" or func.overloadpacket.__name__ in METADATA_QUERIES:
            return func(*args, **kwargs)
        if (
            func is torch.ops.aten._to_copy.default
            and isinstance(args[0], torch.Tensor)
            and id(args[0]) in self.originals
            and set(kwargs) <= {"dtype"}
            and self.call is None
        ):
            index = self.originals[id(args[0])]
            self.events.append(("cast", index, kwargs.get("dtype")))
            out = func(*args, **kwargs)
            self.cast_outputs[id(out)] = index
            return out
        self.events.append(
            ("call", str(func), _describe(args, self.originals), _describe(kwargs, self.originals))
        )
        if not self.whole or self.call is not None:
            self.call = None
            raise _Stop
        out = func(*args, **kwargs)
        self.call = (func, args, kwargs, out)
        return out


class _Rule:
    """What CUDA's autocast kernel does with one operator at one pattern of argument dtypes.

    Attributes:
        kind: ``"same"`` (nothing), ``"apply"`` (casts / dtype / overload below),
            ``"refuse"`` (the kernel raises ``message``), ``"unread"`` (no candidate
            reproduced the observation: the call is traced unchanged and listed).
        casts: ``(flattened argument index, dtype)`` in the order the kernel casts them.
        set_dtype: Set the operator's ``dtype`` argument to float32.
        target: The overload to call instead (with ``dtype=float32``), or ``None``.
        direct: ``(operator, args, kwargs)`` to call instead, with ``("arg", i)`` /
            ``("cast", i)`` for the traced tensors: the one operator the op runs on CUDA,
            where its CPU decomposition takes another path (``softmax`` of float16 to
            float32 runs ``_softmax(x, dim, half_to_float=True)`` on CUDA only).
    """

    __slots__ = ("casts", "cpu_path", "direct", "kind", "message", "set_dtype", "target")

    def __init__(
        self,
        kind: str,
        casts: tuple[tuple[int, torch.dtype], ...] = (),
        set_dtype: bool = False,
        target: Any = None,
        message: str = "",
        direct: tuple[Any, Any, Any] | None = None,
    ) -> None:
        self.kind = kind
        self.casts = casts
        self.set_dtype = set_dtype
        self.target = target
        self.message = message
        self.direct = direct
        self.cpu_path = False  # the CPU decomposes the result another way (noted)

    def __repr__(self) -> str:
        return (
            f"_Rule({self.kind!r}, casts={self.casts!r}, set_dtype={self.set_dtype!r}, "
            f"target={self.target!r}, direct={self.direct is not None})"
        )


class _Ref:
    """A traced argument (``cast``: its autocast cast) in a :attr:`_Rule.direct` call."""

    __slots__ = ("cast", "index")

    def __init__(self, index: int, cast: bool) -> None:
        self.index = index
        self.cast = cast


def _template(value: Any, originals: dict[int, int], casts: dict[int, int]) -> Any:
    """``value`` with the probe's argument tensors (and their casts) as :class:`_Ref`;
    raises ``LookupError`` for any other tensor."""
    if isinstance(value, torch.Tensor):
        if id(value) in originals:
            return _Ref(originals[id(value)], cast=False)
        if id(value) in casts:
            return _Ref(casts[id(value)], cast=True)
        raise LookupError("a tensor the op made itself")
    if isinstance(value, (list, tuple)):
        return type(value)(_template(v, originals, casts) for v in value)
    return value


def _fill(value: Any, leaves: list[Any], cast: list[Any]) -> Any:
    """A :func:`_template` with the traced arguments (or their casts) put back. (A plain
    function: a recursive closure would hold the arguments in a reference cycle, alive in
    the trace until the garbage collector ran.)"""
    if isinstance(value, _Ref):
        return cast[value.index] if value.cast else leaves[value.index]
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, leaves, cast) for v in value)
    return value


def _dtype_argument(op: Any, *, optional: bool = False) -> tuple[int, bool] | None:
    """``(position, keyword-only)`` of the operator's ``dtype`` argument (a ScalarType, which
    schemas type as ``int``; ``optional``: only an optional one), or ``None``."""
    for index, arg in enumerate(op._schema.arguments):
        kind = str(arg.type)
        if arg.name == "dtype" and (kind == "Optional[int]" or (kind == "int" and not optional)):
            return index, bool(arg.kwarg_only)
    return None


def _dtype_unset(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the operator has an optional ``dtype`` argument and this call leaves it None."""
    where = _dtype_argument(op, optional=True)
    if where is None:
        return False
    index, kwarg_only = where
    if kwarg_only or index >= len(args):
        return kwargs.get("dtype") is None
    return args[index] is None


def _with_dtype(
    op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments with ``dtype=float32`` (the caller checked that there is one, unset)."""
    where = _dtype_argument(op, optional=True)
    assert where is not None
    index, kwarg_only = where
    if kwarg_only or index >= len(args):
        return args, {**kwargs, "dtype": torch.float32}
    return (*args[:index], torch.float32, *args[index + 1 :]), kwargs


def _pattern(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("T", value.dtype, value.requires_grad)
    if value is None or isinstance(value, (bool, torch.dtype)):
        return value
    return type(value).__name__


class CudaAutocast:
    """Trace ``torch.autocast("cuda")`` regions with CUDA's rules (see the module docstring).

    Use as a context manager around a CPU trace; :meth:`notes` then says what it did and
    what stayed the CPU's way.

    Args:
        active: ``False`` makes it do nothing (a trace whose figures are not for a CUDA GPU,
            or that runs on CUDA, where torch applies its own rules).
    """

    def __init__(self, *, active: bool = True) -> None:
        self.active = active
        self.key_name: str | None = None
        self.rules: dict[tuple[Any, ...], _Rule] = {}  # the ones this trace used
        self.unread: set[str] = set()
        self.cpu_paths: set[str] = set()  # CUDA's rule applied, but the CPU decomposes it
        # another way after it (listed in the notes)
        self.dtypes_used: set[torch.dtype] = set()
        self.calls = 0
        self.cache_peak = 0
        self.scaler_steps = 0
        self.cuda_regions = 0  # torch.autocast("cuda") regions entered enabled
        self.disabled_scalers = 0  # scale() calls of a GradScaler("cuda") built disabled
        self._cache: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}
        self._cache_bytes = 0
        self._stack: ExitStack | None = None
        self._probe_mode: Any = None

    # --- entering and leaving -----------------------------------------------------------

    def __enter__(self) -> CudaAutocast:
        if not self.active:
            return self
        names = cuda_autocast_op_names()
        self.key_name = _emulation_key(names)
        stack = ExitStack()
        self._stack = stack
        try:
            stack.enter_context(self._patched_amp())
            if self.key_name is not None:
                stack.enter_context(self._kernels(names, self.key_name))
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._clear_cache()
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    @contextmanager
    def _kernels(self, names: tuple[str, ...], key_name: str) -> Iterator[None]:
        """Our kernels on the free autocast key, and that key switched on for this thread."""
        key = getattr(torch._C.DispatchKey, key_name)
        library: Any = torch.library.Library  # untyped in torch's stubs
        fallback = library("_", "IMPL")  # both destroyed below
        lib = library("aten", "IMPL")
        try:
            fallback.fallback(torch.library.fallthrough_kernel, key_name)
            for name in names:
                op = _overload(name)
                if op is not None:
                    lib.impl(name.removeprefix("aten::"), self._kernel(op), key_name)
            was_included = torch._C._dispatch_tls_is_dispatch_key_included(key)
            torch._C._dispatch_tls_set_dispatch_key_included(key, True)
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
            try:
                yield
            finally:
                torch._C._dispatch_tls_set_dispatch_key_excluded(key, True)
                torch._C._dispatch_tls_set_dispatch_key_included(key, was_included)
        finally:
            lib._destroy()
            fallback._destroy()

    @contextmanager
    def _patched_amp(self) -> Iterator[None]:
        """Let ``autocast("cuda")`` and ``GradScaler("cuda")`` run; clear our cache with
        torch's; let ``GradScaler.step`` read its found-inf flags as stand-ins; let
        ``torch.utils.checkpoint`` take the traced tensors for CUDA's, so its recomputation
        runs under the CUDA autocast state of the forward pass, as on the GPU."""
        import torch.cuda.amp.common as amp_common
        import torch.utils.checkpoint as checkpoint
        from torch.amp.autocast_mode import autocast
        from torch.amp.grad_scaler import GradScaler

        from memfit.estimate import stand_in_scalars

        original_check = amp_common.amp_definitely_not_available
        original_bf16 = torch.cuda.is_bf16_supported
        original_clear = torch.clear_autocast_cache
        original_opt_step = GradScaler._maybe_opt_step
        original_enter: Any = autocast.__enter__
        original_scale: Any = GradScaler.scale
        original_infer: Any = checkpoint._infer_device_type

        def clear() -> None:
            original_clear()
            self._clear_cache()

        def enter(region: Any) -> Any:
            if getattr(region, "device", None) == "cuda" and getattr(region, "_enabled", False):
                self.cuda_regions += 1
            return original_enter(region)

        def scale(scaler: Any, outputs: Any) -> Any:
            if getattr(scaler, "_device", None) == "cuda" and not scaler.is_enabled():
                self.disabled_scalers += 1  # made before the trace, where CUDA was missing
            return original_scale(scaler, outputs)

        def infer_device_type(*args: Any) -> Any:
            found = original_infer(*args)
            return "cuda" if found == "cpu" else found

        def opt_step(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            self.scaler_steps += 1
            with stand_in_scalars():
                return original_opt_step(scaler, *args, **kwargs)

        amp_common.amp_definitely_not_available = lambda: False
        torch.cuda.is_bf16_supported = lambda *_a, **_k: True
        torch.clear_autocast_cache = clear
        GradScaler._maybe_opt_step = opt_step  # type: ignore[method-assign,assignment]
        autocast.__enter__ = enter  # type: ignore[method-assign]
        GradScaler.scale = scale  # type: ignore[method-assign,assignment]
        checkpoint._infer_device_type = infer_device_type
        try:
            yield
        finally:
            amp_common.amp_definitely_not_available = original_check
            torch.cuda.is_bf16_supported = original_bf16
            torch.clear_autocast_cache = original_clear
            GradScaler._maybe_opt_step = original_opt_step  # type: ignore[method-assign]
            autocast.__enter__ = original_enter  # type: ignore[method-assign]
            GradScaler.scale = original_scale  # type: ignore[method-assign]
            checkpoint._infer_device_type = original_infer

    # --- the kernel ---------------------------------------------------------------------

    def _excluded(self, *, all_autocast: bool) -> Any:
        """Our key off while the operator runs; with ``all_autocast`` every autocast key, as
        CUDA's kernel excludes ``AutocastFunctionality`` (the traced tensors stand for CUDA
        tensors, which CPU autocast never casts). Without it, CPU autocast still applies
        (a ``torch.autocast("cpu")`` region outside CUDA's)."""
        assert self.key_name is not None
        keys = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, self.key_name))
        if all_autocast:
            for name in ("AutocastCPU", "AutocastCUDA"):
                keys = keys | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, name))
        return torch._C._ExcludeDispatchKeyGuard(keys)

    def _kernel(self, op: Any) -> Callable[..., Any]:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            if not torch.is_autocast_enabled("cuda"):
                with self._excluded(all_autocast=False):
                    return op(*args, **kwargs)
            lower = torch.get_autocast_dtype("cuda")
            rule = self._rule(op, args, kwargs, lower)
            self.calls += 1
            self.dtypes_used.add(lower)
            with self._excluded(all_autocast=True):
                return self._apply(rule, op, args, kwargs, lower)

        return kernel

    def _apply(
        self, rule: _Rule, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], lower: Any
    ) -> Any:
        if rule.kind == "refuse":
            raise RuntimeError(rule.message)
        if rule.kind != "apply":
            return op(*args, **kwargs)
        leaves, spec = tree_flatten((args, kwargs))
        cast = list(leaves)
        if rule.casts:
            for index, dtype in rule.casts:
                cast[index] = self._cast(leaves[index], dtype, lower)
            args, kwargs = tree_unflatten(cast, spec)
        if rule.direct is not None:
            func, template_args, template_kwargs = rule.direct
            call_args = _fill(template_args, leaves, cast)
            call_kwargs = {k: _fill(v, leaves, cast) for k, v in template_kwargs.items()}
            del leaves, cast, args, kwargs  # the traced tensors die when the op is done with them
            return func(*call_args, **call_kwargs)
        if rule.set_dtype:
            args, kwargs = _with_dtype(op, args, kwargs)
        if rule.target is not None:
            return rule.target(*args, **{**kwargs, "dtype": torch.float32})
        return op(*args, **kwargs)

    def _cast(self, tensor: torch.Tensor, dtype: torch.dtype, lower: torch.dtype) -> torch.Tensor:
        """``at::autocast::cached_cast`` for a tensor the kernel casts."""
        cached = (
            dtype == lower
            and tensor.dtype == torch.float32
            and tensor.requires_grad
            and tensor.is_leaf
            and not tensor._is_view()
            and torch.is_autocast_cache_enabled()
            and not torch._C._is_cached_tensor(tensor)  # type: ignore[attr-defined]
        )
        if cached:
            hit = self._cache.get(id(tensor))
            if hit is not None and hit[0]() is tensor:
                return hit[1]
        out: torch.Tensor = torch.ops.aten.to.dtype(tensor, dtype)
        if cached:
            self._cache[id(tensor)] = (weakref.ref(tensor), out)
            self._cache_bytes += int(out.untyped_storage().nbytes())
            self.cache_peak = max(self.cache_peak, self._cache_bytes)
        return out

    def _clear_cache(self) -> None:
        self._cache.clear()
        self._cache_bytes = 0

    # --- reading CUDA's rule ------------------------------------------------------------

    def _rule(
        self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], lower: torch.dtype
    ) -> _Rule:
        leaves, spec = tree_flatten((args, kwargs))
        key = (op, lower, tuple(_pattern(v) for v in leaves), tuple(sorted(kwargs)))
        rule = self.rules.get(key)
        if rule is None:
            rule = _RULES.get(key)
            if rule is None:
                try:
                    rule = self._read_rule(op, leaves, spec, args, kwargs)
                except Exception:  # arguments the probe cannot copy (a tensor subclass, ...)
                    rule = _Rule("unread")
                _RULES[key] = rule
            self.rules[key] = rule
            if rule.kind == "unread":
                self.unread.add(str(op))
            if rule.cpu_path:
                self.cpu_paths.add(str(op))
        return rule

    @contextmanager
    def _probing(self) -> Iterator[None]:
        """Outside the trace: no dispatch or function modes, our key off, a fake mode of
        our own (fake CUDA tensors need no GPU as long as nothing needs their gradient)."""
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._python_dispatch import _disable_current_modes

        assert self.key_name is not None
        keys = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, self.key_name))
        keys = keys | torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
        enabled = torch.is_autocast_enabled("cuda")
        cache = torch.is_autocast_cache_enabled()
        with (
            _disable_current_modes(),
            torch._C.DisableTorchFunction(),
            torch._C._ExcludeDispatchKeyGuard(keys),
            # a step under inference_mode: the probe's own tensors are ordinary ones (the
            # rule does not depend on it, and is cached for steps with and without it)
            torch.inference_mode(False),
            torch.no_grad(),
        ):
            if self._probe_mode is None:
                self._probe_mode = FakeTensorMode()
            torch.set_autocast_cache_enabled(False)
            try:
                yield
            finally:
                torch.set_autocast_enabled("cuda", enabled)
                torch.set_autocast_cache_enabled(cache)

    def _shadow(self, value: Any, device: str) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        with self._probe_mode:
            return torch.empty_strided(
                tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device=device
            )

    def _observe(
        self,
        op: Any,
        shadows: list[Any],
        spec: Any,
        *,
        autocast: bool,
        casts: tuple[tuple[int, torch.dtype], ...] = (),
        set_dtype: bool = False,
        target: Any = None,
    ) -> tuple[Any, ...]:
        """What reaches the dispatch modes when ``op`` runs on the shadows: the casts of
        the arguments and the first other call (or the error)."""
        originals = {id(v): i for i, v in enumerate(shadows) if isinstance(v, torch.Tensor)}
        events: list[tuple[Any, ...]] = []
        leaves = list(shadows)
        torch.set_autocast_enabled("cuda", False)
        for index, dtype in casts:
            events.append(("cast", index, dtype))
            with self._probe_mode:
                leaves[index] = leaves[index].to(dtype)
        args, kwargs = tree_unflatten(leaves, spec)
        if set_dtype:
            args, kwargs = _with_dtype(op, args, kwargs)
        if target is not None:
            kwargs = {**kwargs, "dtype": torch.float32}
        recorder = _Recorder(originals)
        torch.set_autocast_enabled("cuda", autocast)
        try:
            with self._probe_mode, recorder:
                (target or op)(*args, **kwargs)
        except _Stop:  # the probe stopped the op once the kernel had shown what it does
            return tuple(events + recorder.events)
        except Exception as exc:  # the kernel (or the op) refused these arguments
            recorder.events.append(("error", type(exc).__name__, str(exc).split("\n\n")[0]))
        else:
            recorder.events.append(("done",))
        finally:
            torch.set_autocast_enabled("cuda", False)
        return tuple(events + recorder.events)

    def _read_rule(
        self, op: Any, leaves: list[Any], spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> _Rule:
        with self._probing():
            shadows = [self._shadow(v, "cuda") for v in leaves]
            seen = self._observe(op, shadows, spec, autocast=True)
            plain = self._observe(op, shadows, spec, autocast=False)
            if seen == plain:
                return _Rule("same")
            last = seen[-1]
            if last[0] == "error" and plain[-1][0] != "error" and len(seen) == 1:
                return _Rule("refuse", message=last[2])
            # The kernel's casts come first; the op's own decomposition may cast arguments
            # after them (math attention upcasts float16 inputs), so each leading run of
            # the casts seen is a candidate, shortest first.
            casts = tuple((e[1], e[2]) for e in seen if e[0] == "cast")
            prefixes = [casts[:n] for n in range(1, len(casts) + 1)]
            candidates: list[dict[str, Any]] = [{"casts": c} for c in prefixes]
            if _dtype_unset(op, args, kwargs):
                candidates.append({"set_dtype": True})
                candidates += [{"casts": c, "set_dtype": True} for c in prefixes]
            call = next((e for e in seen if e[0] == "call"), None)
            if call is not None:
                other = self._same_packet_overload(op, call[1])
                if other is not None:
                    candidates.append({"target": other})
            for candidate in candidates:
                if self._observe(op, shadows, spec, autocast=False, **candidate) != seen:
                    continue
                # The rule is CUDA's; does the CPU decomposition of the result take the
                # path CUDA's does? Where it does not, run the one operator CUDA runs.
                on_cpu = [self._shadow(v, "cpu") for v in leaves]
                if self._observe(op, on_cpu, spec, autocast=False, **candidate) == seen:
                    return _Rule("apply", **candidate)
                direct = self._direct(op, shadows, spec)
                if direct is not None:
                    return _Rule("apply", casts=direct[0], direct=direct[1])
                rule = _Rule("apply", **candidate)
                rule.cpu_path = True
                return rule
        return _Rule("unread")

    def _direct(
        self, op: Any, shadows: list[Any], spec: Any
    ) -> tuple[tuple[tuple[int, torch.dtype], ...], tuple[Any, Any, Any]] | None:
        """The casts ``op`` makes under CUDA autocast and ``(operator, args, kwargs)`` of the
        one operator it then runs (as :class:`_Ref` templates), or ``None`` if it runs more."""
        originals = {id(v): i for i, v in enumerate(shadows) if isinstance(v, torch.Tensor)}
        recorder = _Recorder(originals, whole=True)
        args, kwargs = tree_unflatten(list(shadows), spec)
        torch.set_autocast_enabled("cuda", True)
        try:
            with self._probe_mode, recorder:
                result = op(*args, **kwargs)
        except Exception:  # _Stop (a second operator) or a failure: not one operator
            return None
        finally:
            torch.set_autocast_enabled("cuda", False)
        if recorder.call is None or recorder.call[3] is not result:
            return None
        func, call_args, call_kwargs, _ = recorder.call
        casts = tuple((e[1], e[2]) for e in recorder.events if e[0] == "cast")
        made = recorder.cast_outputs
        try:
            return casts, (
                func,
                _template(tuple(call_args), originals, made),
                {k: _template(v, originals, made) for k, v in call_kwargs.items()},
            )
        except LookupError:
            return None

    @staticmethod
    def _same_packet_overload(op: Any, called: str) -> Any:
        """The overload named ``called`` if it is another overload of ``op``'s operator that
        takes a ``dtype`` (CUDA's "append dtype" policy redispatches to it)."""
        prefix = f"aten.{op.overloadpacket.__name__}."
        if not called.startswith(prefix) or called == str(op):
            return None
        other = getattr(op.overloadpacket, called.removeprefix(prefix), None)
        if other is None or _dtype_argument(other) is None:
            return None
        return other

    # --- reporting ----------------------------------------------------------------------

    def notes(self) -> list[str]:
        """What the trace did with CUDA autocast, and what stayed the CPU's way."""
        out: list[str] = []
        if not self.active:
            return out
        if self.key_name is None:
            if self.cuda_regions:
                out.append(
                    "this torch leaves no autocast dispatch key free to stand in for CUDA's "
                    "on the CPU: torch.autocast('cuda') regions are traced without CUDA's "
                    "casts (float32 throughout)"
                )
            return out
        if self.calls:
            dtypes = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes_used))
            out.append(
                f"torch.autocast('cuda', {dtypes}) regions traced with CUDA's autocast rules "
                f"read from this torch ({torch.__version__}, {len(self.rules)} distinct calls "
                "of its AutocastCUDA operators), the weight-cast cache included (at most "
                f"{format_bytes(self.cache_peak)} of low-precision parameter copies at once); "
                "tensors the step keeps on the CPU on purpose are cast as if on the GPU, and "
                "the kernels the GPU picks for the low-precision inputs (cuDNN, flash "
                "attention) are still the CPU's"
            )
        if self.calls and not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
            out.append(
                "this torch is built without CUDA, so the rules read from it lack the autocast "
                "kernels only CUDA builds register (cuDNN's RNNs: nn.LSTM, nn.GRU and nn.RNN "
                "run in float32 in the trace, in float16 on the GPU)"
            )
        if self.unread:
            out.append(
                "CUDA's autocast rule could not be read for "
                + ", ".join(sorted(self.unread))
                + ": these calls are traced as the CPU runs them (no autocast cast)"
            )
        if self.cpu_paths:
            out.append(
                "after CUDA's autocast cast, "
                + ", ".join(sorted(self.cpu_paths))
                + " decompose(s) into other operators on the CPU than on CUDA; traced the "
                "CPU's way"
            )
        if self.disabled_scalers:
            out.append(
                "a GradScaler('cuda') made before the trace (outside build() and step()) was "
                "built disabled, as torch builds it without CUDA, and is traced so: its scale, "
                "growth tracker and found-inf tensors (a few 512 B blocks) are not counted; "
                "make it inside build() or step() to trace it"
            )
        if self.scaler_steps:
            out.append(
                "GradScaler('cuda') traced as on the GPU (scale, growth tracker and found-inf "
                "tensors included); its found-inf check is read as 0 (no overflow), so every "
                "traced step updates the weights"
            )
        return out
