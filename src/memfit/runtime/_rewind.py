"""What a retry puts back besides gradients: random number generators and module buffers.

A failed attempt has already drawn random numbers (dropout masks, epsilon-greedy draws) and
may have updated buffers in place (BatchNorm's running statistics and its
``num_batches_tracked``). A retry that did not put them back would train on different masks,
take a different action, or count a batch twice. :class:`RngState` copies the states of the
generators an attempt may draw from and sets them back; :class:`BufferState` does the same
for the buffers that change during a step, and decides what micro-batches do to them.
"""

from __future__ import annotations

import ctypes
import inspect
import random
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from memfit.errors import ConfigError
from memfit.runtime.oom import allocate_retrying, no_alloc_section

if TYPE_CHECKING:
    import torch

__all__ = ["SPLIT_STATS", "BufferState", "RngState", "modules_of", "rng_state"]

#: What micro-batches do to buffers that change during a step (see :class:`BufferState`).
SPLIT_STATS: tuple[str, ...] = ("average", "first", "each")


def _getter_setter(gen: Any) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """How to read and set back one generator's state."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(gen, torch.Generator):
        return gen.get_state, gen.set_state
    if isinstance(gen, random.Random):
        return gen.getstate, gen.setstate
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(gen, np.random.Generator):
            bits = gen.bit_generator
            return (lambda: bits.state), (lambda s: setattr(bits, "state", s))
        if isinstance(gen, np.random.RandomState):
            return gen.get_state, gen.set_state
    raise ConfigError(
        f"cannot save the state of a {type(gen).__name__}",
        key_path="rngs",
        hint="pass torch.Generator, numpy.random.Generator / RandomState or random.Random "
        "objects (an env's action_space.np_random, say)",
    )


class RngState:
    """The states of the random number generators an attempt may draw from.

    Always: torch's CPU generator and every initialised CUDA device's generator (under a
    microsecond); unless ``torch_only``, also NumPy's global ``RandomState`` (when NumPy is
    imported; under a microsecond while it does not change, 25 us when it does) and Python's
    ``random`` (about 5 us); plus ``extra`` generators (a
    Gymnasium space's ``np_random``, a ``torch.Generator`` a sampler uses).

    Args:
        extra: More generators to save and put back.
        torch_only: Leave NumPy's and Python's global generators alone (for steps that
            draw only from torch).

    Raises:
        ConfigError: When an ``extra`` generator is of a kind memfit cannot save.
    """

    def __init__(self, extra: Iterable[Any] = (), *, torch_only: bool = False) -> None:
        self._extra = [_getter_setter(g) for g in extra]
        self._torch_only = torch_only
        self._saved: list[tuple[Callable[[Any], None], Any]] = []
        self._np_raw: bytes | None = None
        self._np_full: Any = None

    def capture(self) -> None:
        """Copy every generator's state (replacing the previous copy)."""
        saved: list[tuple[Callable[[Any], None], Any]] = []
        if not self._torch_only:
            saved.append((random.setstate, random.getstate()))
        torch = sys.modules.get("torch")
        if torch is not None:
            saved.append((torch.set_rng_state, torch.get_rng_state()))
            if torch.cuda.is_initialized():
                saved.append((torch.cuda.set_rng_state_all, torch.cuda.get_rng_state_all()))
        np = sys.modules.get("numpy") if not self._torch_only else None
        if np is not None:
            saved.append((np.random.set_state, self._numpy_state(np)))
        for get, set_ in self._extra:
            saved.append((set_, get()))
        self._saved = saved

    def _numpy_state(self, np: Any) -> Any:
        """NumPy's global state, copied only when it changed since the last copy.

        ``np.random.get_state()`` costs about 25 us (it builds a new dict and array each
        time); the raw MT19937 state (624 words and a position, 2.5 KB) reads in 0.3 us. When
        those bytes are the same as at the last copy, and that copy held no cached Gaussian
        (the one draw that changes the state without touching the words), the state is the
        same and the last copy is still right.
        """
        raw = self._np_raw_state(np)
        full = self._np_full
        if raw is not None and raw == self._np_raw and full is not None and not full[3]:
            return full
        full = np.random.get_state()
        self._np_raw, self._np_full = self._np_raw_state(np), full
        return full

    @staticmethod
    def _np_raw_state(np: Any) -> bytes | None:
        try:
            bits = np.random.mtrand._rand._bit_generator
            if type(bits).__name__ != "MT19937":
                return None
            raw: bytes = ctypes.string_at(bits.ctypes.state_address, 624 * 4 + 4)
            return raw
        except Exception:  # another NumPy layout: always take the full copy
            return None

    def restore(self) -> None:
        """Set every generator back to the last :meth:`capture` (no-op before one)."""
        for set_, state in self._saved:
            set_(state)


def rng_state(restore_rng: bool | str, extra: Iterable[Any]) -> RngState | None:
    """The :class:`RngState` a guard's ``restore_rng`` asks for (``None``: do not restore).

    Raises:
        ConfigError: When ``restore_rng`` is not ``True``, ``False`` or ``"torch"``.
    """
    if restore_rng is False:
        return None
    if restore_rng is True or restore_rng == "torch":
        return RngState(extra, torch_only=restore_rng == "torch")
    raise ConfigError(
        f"restore_rng must be True, False or 'torch', not {restore_rng!r}",
        key_path="restore_rng",
        hint="'torch' puts back only torch's generators (cheaper, for steps that draw "
        "nothing from NumPy or random)",
    )


def modules_of(fn: Any) -> list[torch.nn.Module]:
    """The ``torch.nn.Module`` objects a function refers to.

    Looks at a bound method's ``self``, the function's closure and the globals it names (a
    ``loss_fn`` written as ``lambda b: F.mse_loss(model(b[0]), b[1])`` finds ``model``),
    and, one level down, at modules held as attributes of the objects found there.
    """
    torch_module = sys.modules.get("torch")
    if torch_module is None:
        return []
    module_type = torch_module.nn.Module
    found: dict[int, torch.nn.Module] = {}

    def add(obj: Any, depth: int) -> None:
        if isinstance(obj, module_type):
            found.setdefault(id(obj), obj)
        elif depth > 0 and hasattr(obj, "__dict__") and not isinstance(obj, type):
            for value in list(vars(obj).values()):
                add(value, depth - 1)

    target = getattr(fn, "__self__", None)
    if target is not None:
        add(target, 1)
    func = getattr(fn, "__func__", fn)
    if inspect.isfunction(func):
        try:
            names = inspect.getclosurevars(func)
        except (TypeError, ValueError):
            names = None
        if names is not None:
            for value in [*names.nonlocals.values(), *names.globals.values()]:
                add(value, 1)
    elif target is None:
        add(fn, 1)  # a callable object: a module itself, or one that holds modules
    return list(found.values())


class BufferState:
    """The buffers a step changes in place, copied before each attempt and put back on retry.

    Which buffers: every buffer of the normalisation layers that track running statistics
    (``BatchNorm*``, ``SyncBatchNorm``, ``InstanceNorm*`` with ``track_running_stats``), and
    any other buffer of ``modules`` whose version counter moved during the first step (a
    running mean of observations, say). Copies live next to the buffers and are reused.

    When a step runs in micro-batches, each one updates the running statistics by itself.
    ``split_stats`` says what the step leaves behind:

    * ``"average"`` (default): every micro-batch starts from the statistics before the step,
      and the step ends with their average weighted by items. With momentum ``m`` that is
      ``(1 - m) * old + m * mean of the micro-batch statistics``: the running mean is exactly
      the whole batch's update, the running variance leaves out the spread between the
      micro-batches' means, and ``num_batches_tracked`` grows by one, as for the whole batch.
    * ``"first"``: only the first micro-batch updates them (the others are put back).
    * ``"each"``: every micro-batch updates them, as a gradient-accumulation loop does
      (``num_batches_tracked`` grows by the number of micro-batches).

    Args:
        modules: The modules whose buffers to watch.
        split_stats: ``"average"``, ``"first"`` or ``"each"``.
    """

    def __init__(self, modules: Sequence[torch.nn.Module], split_stats: str = "average") -> None:
        if split_stats not in SPLIT_STATS:
            raise ConfigError(
                f"split_stats must be one of {', '.join(SPLIT_STATS)}, not {split_stats!r}",
                key_path="split_stats",
            )
        self.split_stats = split_stats
        self._candidates: list[torch.Tensor] = []
        self._tracked: list[torch.Tensor] = []
        self._versions: list[int] | None = None  # of the candidates, before the first step
        self._saved: list[torch.Tensor] = []
        self._acc: list[torch.Tensor] = []
        if not modules:
            return
        import torch

        norm = torch.nn.modules.batchnorm._NormBase
        seen: set[int] = set()
        tracked: list[torch.Tensor] = []
        candidates: list[torch.Tensor] = []
        for root in modules:
            for module in root.modules():
                stats = isinstance(module, norm) and module.track_running_stats
                for buf in module.buffers(recurse=False):
                    if id(buf) in seen:
                        continue
                    seen.add(id(buf))
                    (tracked if stats else candidates).append(buf)
        self._tracked = tracked
        self._candidates = candidates
        if candidates:
            self._versions = [b._version for b in candidates]
            self._tracked = tracked + candidates  # until the first step says which change

    @property
    def active(self) -> bool:
        """Whether there is any buffer to watch."""
        return bool(self._tracked)

    def capture(self) -> None:
        """Copy the watched buffers (into copies made once and reused)."""
        if not self._tracked:
            return
        import torch

        if len(self._saved) != len(self._tracked):
            self._saved = allocate_retrying(lambda: [torch.empty_like(b) for b in self._tracked])
        with torch.no_grad(), no_alloc_section():
            torch._foreach_copy_(self._saved, self._tracked)

    def restore(self) -> None:
        """Put the watched buffers back to the last :meth:`capture`."""
        if not self._tracked or len(self._saved) != len(self._tracked):
            return
        import torch

        with torch.no_grad(), no_alloc_section():
            torch._foreach_copy_(self._tracked, self._saved)

    def add_to_average(self, weight: float) -> None:
        """Add the buffers' values, weighted, to the running average of a split step
        (integer buffers, such as ``num_batches_tracked``, keep their latest value)."""
        if not self._tracked:
            return
        import torch

        if len(self._acc) != len(self._tracked):
            self._acc = allocate_retrying(lambda: [torch.zeros_like(b) for b in self._tracked])
        with torch.no_grad(), no_alloc_section():
            for acc, buf in zip(self._acc, self._tracked, strict=True):
                if buf.is_floating_point() or buf.is_complex():
                    acc.add_(buf, alpha=weight)
                else:
                    acc.copy_(buf)

    def commit_average(self) -> None:
        """Write the averaged values into the buffers and clear the average."""
        if not self._acc:
            return
        import torch

        with torch.no_grad(), no_alloc_section():
            for acc, buf in zip(self._acc, self._tracked, strict=True):
                buf.copy_(acc)
                acc.zero_()

    def discard_average(self) -> None:
        """Forget a split step's running average (the step failed)."""
        if not self._acc:
            return
        import torch

        with torch.no_grad(), no_alloc_section():
            for acc in self._acc:
                acc.zero_()

    def first_step_done(self) -> None:
        """After the first completed step: keep watching only the buffers that changed."""
        if self._versions is None:
            return
        changed = [
            b for b, v in zip(self._candidates, self._versions, strict=True) if b._version != v
        ]
        norm_count = len(self._tracked) - len(self._candidates)
        self._tracked = self._tracked[:norm_count] + changed
        self._versions = None
        self._candidates = []
        self._saved = []
        self._acc = []
