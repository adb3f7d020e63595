"""A ``jax.pmap`` step, compiled for its devices without them.

``jax.pmap`` (in jax 0.10.2, installed here) is ``jax.jit`` of ``jax.shard_map`` over a
one-axis mesh of the mapped axis' size (``jax/_src/pmap.py``), built when the step is called
and needing that many local devices. memfit builds the same program over an
``AbstractMesh`` instead: each mapped argument gets ``NamedSharding(mesh, P(..., axis_name
at its mapped axis))`` and the step sees its own slice with the mapped axis removed, as
``pmap`` hands it; outputs get the mapped axis back at ``out_axes``. XLA's GPU compiler then
compiles it for that many compile-only devices, the collectives over ``axis_name`` included,
and every figure is per device.

For a compile on this machine's backend (one CPU device) the same ``shard_map`` is built over
a mesh of that one device, each mapped axis of size 1: one device's program, its collectives
over one device (the identity; their buffers are not counted, and the estimate says so).

The ``pmap`` call's options are read from the function ``jax.pmap`` returns (its closure, as
``jax/_src/pmap.py`` of jax 0.10.2 lays it out). A function made by this jax's ``pmap``
whose options cannot be read is refused with a hint; a ``pmap`` that another jax built
differently is not recognised, and its export fails as any non-jit function's does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memfit.errors import ConfigError, EstimateError

__all__ = ["PmapStep", "pmap_step", "unpmap"]

_HINT = (
    "write the step as jax.jit(jax.shard_map(step, mesh=AbstractMesh((N,), ('i',)), ...)) "
    "with NamedSharding arguments, or estimate the per-device step unmapped"
)


@dataclass(frozen=True)
class PmapStep:
    """What ``jax.pmap(fun, ...)`` was called with.

    Attributes:
        fun: The mapped function.
        axis_name: The mapped axis' name (collectives use it).
        in_axes: Per positional argument, its mapped axis (an int, ``None`` or a pytree
            prefix of them); ``0`` for keyword arguments.
        static: Positional indices of ``static_broadcasted_argnums``.
        donate: Indices of donated arguments among the non-static ones.
        out_axes: The output's mapped axes, flattened.
    """

    fun: Callable[..., Any]
    axis_name: Any
    in_axes: Any
    static: tuple[int, ...]
    donate: tuple[int, ...]
    out_axes: tuple[Any, ...]

    def _split(self, args: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        in_axes = self.in_axes
        dynamic = [a for i, a in enumerate(args) if i not in self.static]
        if isinstance(in_axes, (list, tuple)):
            if len(in_axes) != len(dynamic):
                raise ConfigError(
                    f"the pmap step's in_axes has {len(in_axes)} entries for "
                    f"{len(dynamic)} arguments",
                    key_path="args",
                    hint="pass the arguments the pmapped step is called with",
                )
            axes = list(in_axes)
        else:
            axes = [in_axes] * len(dynamic)
        return dynamic, axes

    def _leaf_axes(self, dynamic: Sequence[Any], axes: Sequence[Any], kwargs: Any) -> Any:
        import jax

        def spread(axis: Any, sub: Any) -> Any:
            return jax.tree_util.tree_map(lambda _: axis, sub)

        per_arg = [
            jax.tree_util.tree_map(spread, axis, arg, is_leaf=_is_none)
            for axis, arg in zip(axes, dynamic, strict=True)
        ]
        return per_arg, jax.tree_util.tree_map(lambda _: 0, kwargs)

    def devices(self, args: Sequence[Any], kwargs: Any) -> int:
        """The mapped axis' size: the number of devices the step runs on.

        Raises:
            ConfigError: When no argument is mapped, or the mapped sizes differ.
        """
        import jax

        dynamic, axes = self._split(args)
        arg_axes, kw_axes = self._leaf_axes(dynamic, axes, kwargs)
        sizes = set()
        for tree, tree_axes in ((dynamic, arg_axes), (kwargs, kw_axes)):
            leaves = jax.tree_util.tree_leaves(tree)
            leaf_axes = jax.tree_util.tree_leaves(tree_axes, is_leaf=_is_none)
            for leaf, axis in zip(leaves, leaf_axes, strict=True):
                if axis is not None:
                    shape = getattr(leaf, "shape", ())
                    if len(shape) <= axis:
                        raise ConfigError(
                            f"a pmapped argument of shape {tuple(shape)} has no axis {axis}",
                            key_path="args",
                            hint="each mapped argument carries the device axis (size N)",
                        )
                    sizes.add(int(shape[axis]))
        if len(sizes) != 1:
            raise ConfigError(
                "the pmapped arguments' mapped axes "
                + (
                    "differ in size: " + ", ".join(map(str, sorted(sizes)))
                    if sizes
                    else "are missing"
                ),
                key_path="args",
                hint="every mapped argument's axis is the number of devices",
            )
        return sizes.pop()

    def _out_axis(self) -> Any:
        axes = set(self.out_axes)
        if len(axes) != 1:
            raise EstimateError(
                "memfit compiles a pmap step whose outputs share one out_axes "
                f"(this one has {sorted(axes, key=str)})",
                hint=_HINT,
            )
        return axes.pop()

    def _call_fun(self, args: Sequence[Any], dynamic: Sequence[Any], kwargs: Any) -> Any:
        statics = {i: args[i] for i in self.static}
        it = iter(dynamic)
        full = [statics[i] if i in statics else next(it) for i in range(len(args))]
        return self.fun(*full, **kwargs)

    def sharded(
        self, args: Sequence[Any], kwargs: Any
    ) -> tuple[Callable[..., Any], list[Any], Any]:
        """The step as ``jit(shard_map)`` over an ``AbstractMesh`` of the mapped size, and its
        dynamic positional and keyword arguments as abstract values sharded over it."""
        from jax.sharding import AbstractMesh

        n = self.devices(args, kwargs)
        return self._shard_mapped(args, kwargs, AbstractMesh((n,), (self.axis_name,)), None)

    def per_device(
        self, args: Sequence[Any], kwargs: Any
    ) -> tuple[Callable[..., Any], list[Any], Any]:
        """The program of one device, for this process's backend: the same ``shard_map`` over
        a mesh of this process's first device, each mapped axis of size 1 (collectives over
        ``axis_name`` then span one device: the identity)."""
        import jax
        import numpy as np
        from jax.sharding import Mesh

        self.devices(args, kwargs)  # checks the mapped axes
        mesh = Mesh(np.array(jax.devices()[:1]), (self.axis_name,))
        return self._shard_mapped(args, kwargs, mesh, 1)

    def _shard_mapped(
        self, args: Sequence[Any], kwargs: Any, mesh: Any, resize: int | None
    ) -> tuple[Callable[..., Any], list[Any], Any]:
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as _PartitionSpec

        P: Any = _PartitionSpec  # untyped in jax's stubs
        shaped: Any = jax.ShapeDtypeStruct
        dynamic, axes = self._split(args)
        arg_axes, kw_axes = self._leaf_axes(dynamic, axes, kwargs)
        out_axis = self._out_axis()

        def spec(axis: Any) -> Any:
            return P() if axis is None else P(*([None] * axis), self.axis_name)

        def abstract(leaf: Any, axis: Any) -> Any:
            shape = tuple(jnp.shape(leaf))
            if axis is not None and resize is not None:
                shape = (*shape[:axis], resize, *shape[axis + 1 :])
            sharding = NamedSharding(mesh, spec(axis))
            return shaped(shape, jnp.result_type(leaf), sharding=sharding)

        def local(leaf: Any, axis: Any) -> Any:
            return leaf if axis is None else jnp.squeeze(leaf, axis)

        flat_args = [
            jax.tree_util.tree_map(abstract, arg, ax, is_leaf=_is_none)
            for arg, ax in zip(dynamic, arg_axes, strict=True)
        ]
        flat_kwargs = jax.tree_util.tree_map(abstract, kwargs, kw_axes)
        in_specs = (
            tuple(jax.tree_util.tree_map(spec, ax, is_leaf=_is_none) for ax in arg_axes),
            jax.tree_util.tree_map(spec, kw_axes),
        )

        def per_device(dyn: Any, kw: Any) -> Any:
            mine = [
                jax.tree_util.tree_map(local, arg, ax, is_leaf=_is_none)
                for arg, ax in zip(dyn, arg_axes, strict=True)
            ]
            out = self._call_fun(args, mine, jax.tree_util.tree_map(local, kw, kw_axes))
            if out_axis is None:
                return out
            return jax.tree_util.tree_map(lambda y: jnp.expand_dims(y, out_axis), out)

        mapped = jax.shard_map(
            per_device, mesh=mesh, in_specs=in_specs, out_specs=spec(out_axis), check_vma=False
        )

        def call(*dyn: Any, **kw: Any) -> Any:
            return mapped(tuple(dyn), kw)

        return jax.jit(call, donate_argnums=self.donate), flat_args, flat_kwargs


def _is_none(x: Any) -> bool:
    return x is None


@functools.cache
def _reference_code() -> Any:
    """The code of the function this jax's ``pmap`` returns (made once)."""
    import jax

    return jax.pmap(lambda x: x).__code__


def pmap_step(fn: Any) -> PmapStep | None:
    """The options of a function ``jax.pmap`` made, or ``None`` for any other function.

    Raises:
        EstimateError: When ``fn`` is a ``pmap`` whose options cannot be read (another
            jax's layout), with a hint.
    """
    code = getattr(fn, "__code__", None)
    if code is None or not hasattr(fn, "lower"):
        return None
    try:
        if code is not _reference_code():
            return None
        params = inspect.getclosurevars(inspect.getclosurevars(fn).nonlocals["infer_params"])
        found = params.nonlocals
        fun = fn.__wrapped__
        axis_name = found["axis_name"]
        step = PmapStep(
            fun=fun,
            axis_name=axis_name,
            in_axes=found["in_axes"],
            static=tuple(found["static_broadcasted_tuple"]),
            donate=tuple(found["donate_tuple"]),
            out_axes=tuple(found["out_axes_flat"]),
        )
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise EstimateError(
            f"memfit cannot read this jax.pmap step's options ({exc})", hint=_HINT
        ) from exc
    return step


def unpmap(
    fn: Callable[..., Any], args: Any, kwargs: Any, *, sharded: bool
) -> tuple[Callable[..., Any], Any, Any, list[str]]:
    """A step ``jax.pmap`` made, as the program each device runs
    (:class:`PmapStep`): for the GPU compile, ``jit(shard_map)`` over an abstract
    mesh of the mapped size; here, one device's program. Any other step as it is."""
    pmapped = pmap_step(fn)
    if pmapped is None:
        return fn, args, kwargs, []
    devices = pmapped.devices(args, kwargs)
    if sharded:
        step, new_args, new_kwargs = pmapped.sharded(args, kwargs)
        how = (
            f"a jax.pmap step over {devices} devices, compiled as jax.pmap builds it: jit of "
            f"shard_map over a mesh of {devices} (compile-only) devices"
        )
    else:
        step, new_args, new_kwargs = pmapped.per_device(args, kwargs)
        how = (
            f"a jax.pmap step over {devices} devices, compiled here as one device's program "
            "(the mapped axis of size 1; collectives over it are the identity and their "
            "buffers are not counted)"
        )
    return step, tuple(new_args), new_kwargs, [how]
