"""A jitted step's host callbacks, as what they hold on the device, for the CUDA export.

A host callback (``jax.debug.callback``, ``jax.debug.print``, ``io_callback``,
``pure_callback``) cannot be lowered for CUDA on a machine whose JAX backend is the CPU: its
lowering asks the backend for the callback's device and JAX refuses a backend of another
platform (``the platform for the specified backend cpu is different from the lowering
platform cuda``). On the card, a callback is a custom call (``xla_python_gpu_callback``)
whose operands are device buffers copied to the host and whose results are device buffers
copied back; the host side holds no device memory.

:func:`strip_callbacks` re-traces the step's jaxpr with every callback equation replaced:
``debug_callback`` / ``debug_print`` (and checkify's ``check``) by nothing, ``io_callback`` /
``pure_callback`` by zeros of their result shapes and dtypes (so the rest of the program is
the same). What the callbacks held on the device, their operands and results, is returned
as bytes, to be added to the compile's buffers: every callback's, as if all were alive at
once (an upper bound: a callback inside a loop body holds one iteration's operands; XLA may
also have kept them alive anyway).

Only sub-jaxprs that hold a callback are re-traced (scan, while, cond, jit, custom_jvp /
custom_vjp calls, remat, shard_map: any parameter that is a jaxpr); the rest is bound as it
was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memfit.errors import EstimateError

__all__ = ["CALLBACK_PRIMITIVES", "HeldByCallbacks", "strip_callbacks"]

#: The primitives whose lowering is a host callback (``emit_python_callback``):
#: ``jax.debug.callback`` (``jax._src.debugging.debug_callback_p``), ``jax.debug.print``
#: (``debug_print_p``), ``jax.pure_callback`` and ``io_callback``
#: (``jax._src.callback.pure_callback_p``, ``io_callback_p``) and checkify's ``check_p``.
CALLBACK_PRIMITIVES: tuple[str, ...] = (
    "debug_callback",
    "debug_print",
    "pure_callback",
    "io_callback",
    "check",
)


@dataclass(frozen=True)
class HeldByCallbacks:
    """What a step's host callbacks hold on the device.

    Attributes:
        count: Callback equations found (each once, wherever it is nested).
        operand_bytes: Bytes of their operands (device buffers the host reads).
        result_bytes: Bytes of their results (device buffers the host writes).
        kinds: ``(primitive, how many)`` found.
    """

    count: int
    operand_bytes: int
    result_bytes: int
    kinds: tuple[tuple[str, int], ...]

    @property
    def held_bytes(self) -> int:
        """Operands and results together: the bound added to the compile's buffers."""
        return self.operand_bytes + self.result_bytes

    def describe(self) -> str:
        """``"2 host callbacks (1 debug_callback, 1 pure_callback)"``."""
        kinds = ", ".join(f"{n} {name}" for name, n in self.kinds)
        plural = "s" if self.count != 1 else ""
        return f"{self.count} host callback{plural} ({kinds})"


def _aval_bytes(aval: Any) -> int:
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    import numpy as np

    count = 1
    for d in shape:
        count *= int(d)
    try:
        size = int(np.dtype(dtype).itemsize)
    except TypeError:  # extended dtypes (PRNG keys): their physical size
        size = int(getattr(dtype, "itemsize", 0) or 0)
    return count * size


class _Counter:
    def __init__(self) -> None:
        self.count = 0
        self.operand_bytes = 0
        self.result_bytes = 0
        self.kinds: dict[str, int] = {}

    def add(self, name: str, operands: Sequence[Any], results: Sequence[Any]) -> None:
        self.count += 1
        self.kinds[name] = self.kinds.get(name, 0) + 1
        self.operand_bytes += sum(_aval_bytes(a) for a in operands)
        self.result_bytes += sum(_aval_bytes(a) for a in results)


def _sub_jaxprs(value: Any) -> list[Any]:
    """The jaxprs (open or closed) a parameter value holds, one level down."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    if isinstance(value, (ClosedJaxpr, Jaxpr)):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, (ClosedJaxpr, Jaxpr))]
    return []


def has_callbacks(jaxpr: Any) -> bool:
    """Whether ``jaxpr`` (open or closed) or any jaxpr nested in its equations' parameters
    holds a host callback equation."""
    from jax.extend.core import ClosedJaxpr

    inner = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    for eqn in inner.eqns:
        if eqn.primitive.name in CALLBACK_PRIMITIVES:
            return True
        for value in eqn.params.values():
            if any(has_callbacks(sub) for sub in _sub_jaxprs(value)):
                return True
    return False


def _retrace(jaxpr: Any, counter: _Counter) -> Any:
    """``jaxpr`` (open or closed) with its callbacks replaced, of the same kind and type."""
    from jax._src import linear_util as lu
    from jax._src.interpreters import partial_eval as pe
    from jax.extend.core import ClosedJaxpr

    closed = isinstance(jaxpr, ClosedJaxpr)
    inner = jaxpr.jaxpr if closed else jaxpr
    consts = list(jaxpr.consts) if closed else []
    in_avals = [v.aval for v in inner.invars]

    def run(*args: Any) -> list[Any]:
        return _eval(inner, consts, list(args), counter)

    fun = lu.wrap_init(run, debug_info=inner.debug_info)
    new, _, new_consts = pe.trace_to_jaxpr_dynamic(fun, in_avals)
    if closed:
        return ClosedJaxpr(new, new_consts)
    if new_consts:
        # the caller reports it among the export's reasons and lowers the step directly
        raise EstimateError("an open jaxpr gained constants when its callbacks were replaced")
    return new


def _eval(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], counter: _Counter) -> list[Any]:
    """Evaluate ``jaxpr`` on ``args`` under the current trace, callbacks replaced."""
    from jax import lax
    from jax.extend.core import Literal

    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, Literal) else env[v]

    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = value
    for var, value in zip(jaxpr.invars, args, strict=True):
        env[var] = value
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        invals = [read(v) for v in eqn.invars]
        if name in CALLBACK_PRIMITIVES:
            counter.add(name, [v.aval for v in eqn.invars], [v.aval for v in eqn.outvars])
            outs: list[Any] = [lax.full(v.aval.shape, 0, v.aval.dtype) for v in eqn.outvars]
        else:
            params = dict(eqn.params)
            changed = False
            for key, value in eqn.params.items():
                subs = _sub_jaxprs(value)
                if not subs or not any(has_callbacks(s) for s in subs):
                    continue
                if isinstance(value, (tuple, list)):
                    params[key] = type(value)(
                        _retrace(v, counter) if v in subs and has_callbacks(v) else v for v in value
                    )
                else:
                    params[key] = _retrace(value, counter)
                changed = True
            # the primitive's own effect rule reads the new sub-jaxprs' effects
            # as jax.core.eval_jaxpr binds: call-like primitives (custom_jvp_call, ...) take
            # their jaxpr as a function
            bind_params = eqn.primitive.get_bind_params(params if changed else eqn.params)
            subfuns: tuple[Any, ...] = ()
            if isinstance(bind_params, tuple):  # older JAX: (subfuns, params)
                subfuns, bind_params = bind_params
            ctx = getattr(getattr(eqn, "ctx", None), "manager", None)
            with ctx if ctx is not None else contextlib.nullcontext():
                result = eqn.primitive.bind(*subfuns, *invals, **bind_params)
            outs = list(result) if eqn.primitive.multiple_results else [result]
        for var, value in zip(eqn.outvars, outs, strict=True):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def strip_callbacks(
    fn: Callable[..., Any], leaves: Sequence[Any]
) -> tuple[Callable[..., Any], tuple[int, ...], HeldByCallbacks] | None:
    """``fn`` over flat leaves with its host callbacks replaced, or ``None`` when it has none.

    Args:
        fn: A function of the flat leaves returning a list of arrays (the step over leaves).
        leaves: Arrays or ``jax.ShapeDtypeStruct`` (shapes only are read).

    Returns:
        ``(stripped, donated, held)``: the stripped function of the same leaves (not
        jitted), the leaf indices the step's own ``jax.jit`` donates, and what the
        callbacks held.

    Raises:
        Whatever JAX raises when it cannot re-trace the step (the caller falls back).
    """
    import jax

    closed = jax.make_jaxpr(fn)(*leaves)
    if not has_callbacks(closed):
        return None
    donated = _donated_leaves(closed)
    counter = _Counter()
    stripped = _retrace(closed, counter)

    def run(*args: Any) -> list[Any]:
        return list(jax.core.eval_jaxpr(stripped.jaxpr, stripped.consts, *args))

    held = HeldByCallbacks(
        count=counter.count,
        operand_bytes=counter.operand_bytes,
        result_bytes=counter.result_bytes,
        kinds=tuple(sorted(counter.kinds.items())),
    )
    return run, donated, held


def _donated_leaves(closed: Any) -> tuple[int, ...]:
    """Leaf indices the step's own ``jax.jit`` donates: the top-level jit equation's
    ``donated_invars`` mapped back to the jaxpr's inputs."""
    positions = {var: i for i, var in enumerate(closed.jaxpr.invars)}
    donated: set[int] = set()
    for eqn in closed.jaxpr.eqns:
        flags = eqn.params.get("donated_invars")
        if not flags:
            continue
        for var, flag in zip(eqn.invars, flags, strict=False):
            if flag and var in positions:
                donated.add(positions[var])
    return tuple(sorted(donated))
