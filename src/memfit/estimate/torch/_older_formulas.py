"""What older torch versions kept that the installed one does not.

A trace runs the installed torch, whose derivative formulas (``derivatives.yaml``) decide what
each op's backward keeps, and whose optimizers decide their intermediates. When the target
runs an older torch that kept more, the trace keeps it too. The changes modelled, each with
its source:

* **softmax and log_softmax before torch 1.11**: their backward formulas took ``self`` (the
  input) as well as the result (``_softmax_backward_data(grad, result, dim, self)``), only
  for its dtype, so autograd kept the input alive until backward: one more tensor of the
  input's size per call (pytorch#49600, #64000; removed by #65242 for torch 1.11, which
  passes the input's dtype instead). For attention this is a ``[B, H, L, L]`` tensor per
  layer.

* **foreach Adam and AdamW before torch 2.1**: the step computed ``denom =
  _foreach_add(exp_avg_sq_sqrt, eps)`` out of place while ``exp_avg_sq_sqrt`` was still
  referenced, so two parameter-sized lists were alive at ``_foreach_addcdiv_`` where torch
  2.1 keeps one (pytorch#97712, fixed by #104780 for Adam and #104898 for AdamW, merged
  2023-07-07 and 2023-07-10: nightlies from before then, such as ``2.1.0.dev20230623``, still
  have it).

The softmax rule makes the op's output hold its input: the input lives as long as the output's
storage, which the op's backward node keeps until backward runs (or the graph is freed). The
Adam rule adds the out-of-place ``denom`` list at the ``eps`` add and frees it after
``_foreach_addcdiv_``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from memfit.hardware.rules import rule

__all__ = ["OlderFormulas"]

_SOFTMAX = frozenset({"aten._softmax.default", "aten._log_softmax.default"})
_ADAMS = frozenset({"Adam", "AdamW"})


def _dev_date(version: str | None) -> int | None:
    """``"2.1.0.dev20230623+cu118"`` -> ``20230623``."""
    if not version or ".dev" not in version:
        return None
    digits = version.split(".dev", 1)[1][:8]
    return int(digits) if digits.isdigit() and len(digits) == 8 else None


class OlderFormulas:
    """Keeps what an older torch's backward formulas kept (see the module docstring).

    Args:
        torch_version: The target's torch ``(major, minor)``; ``None``: the installed one
            (nothing to add).
        version_text: The target's torch version as given (a nightly's date decides the
            Adam rule), or ``None``.
    """

    def __init__(
        self, torch_version: tuple[int, int] | None, version_text: str | None = None
    ) -> None:
        self.softmax_keeps_input = bool(
            rule("torch", "autograd.softmax_keeps_input", torch=torch_version)
        )
        date = _dev_date(version_text)
        fix = rule("torch", "optim.adam_foreach_fix_nightly", torch=torch_version)
        self.adam_two_lists = bool(
            rule("torch", "optim.adam_foreach_two_lists", torch=torch_version)
        ) or (fix is not None and date is not None and date < int(fix))
        self.held = 0
        self.denoms = 0
        self._refs: dict[int, Any] = {}
        self._sqrt: set[int] = set()
        self._pending: list[Any] = []

    @property
    def active(self) -> bool:
        """Whether any older rule applies to the target."""
        return self.softmax_keeps_input or self.adam_two_lists

    def on_op(self, trace: Any, name: str, args: tuple[Any, ...], out: Any) -> None:
        """Called after each op of the trace."""
        if self.adam_two_lists and trace.optimizer_class in _ADAMS:
            self._adam(trace, name, args, out)
        if not (self.softmax_keeps_input and name in _SOFTMAX):
            return
        inp = args[0]
        # Below autograd (where the trace sees the op) the output is not yet marked as
        # requiring grad; the input tells whether autograd records the op.
        if not (
            torch.is_grad_enabled()
            and isinstance(inp, torch.Tensor)
            and isinstance(out, torch.Tensor)
            and inp.requires_grad
        ):
            return
        storage = out.untyped_storage()
        key = id(storage)
        self._refs[key] = inp
        weakref.finalize(storage, self._refs.pop, key, None)
        self.held += 1

    def _adam(self, trace: Any, name: str, args: tuple[Any, ...], out: Any) -> None:
        if name == "aten._foreach_sqrt.default":
            self._sqrt = {id(t.untyped_storage()) for t in out}
        elif name.startswith("aten._foreach_add_.Scalar") and self._sqrt:
            tensors = args[0]
            if {id(t.untyped_storage()) for t in tensors} == self._sqrt:
                # the older step's denom: a new list of the same sizes, alive to the update
                for t in tensors:
                    size = int(t.untyped_storage().nbytes())
                    self._pending.append(trace.add(size, "temporaries", None))
                self.denoms += 1
        elif name.startswith("aten._foreach_addcdiv_") and self._pending:
            for record in self._pending:
                trace.release(record)
            self._pending = []
            self._sqrt = set()

    def notes(self) -> list[str]:
        """What was kept."""
        out = []
        if self.held:
            out.append(
                "the target's torch (before 1.11) keeps softmax's input for backward: "
                f"{self.held} softmax / log_softmax call(s) hold their input until backward "
                "(pytorch#65242 removed it in 1.11)"
            )
        if self.denoms:
            out.append(
                "the target's torch (before 2.1, or a nightly from before July 2023) runs "
                "foreach Adam/AdamW with two parameter-sized intermediates at the update "
                "(pytorch#97712; one since #104780/#104898): traced so"
            )
        return out
