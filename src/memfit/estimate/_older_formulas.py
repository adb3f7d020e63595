"""What autograd kept for backward in torch versions older than the one installed.

A trace runs the installed torch, whose derivative formulas (``derivatives.yaml``) decide what
each op's backward keeps. When the target runs an older torch whose formula kept more, the
trace keeps it too. The changes modelled, each with its source:

* **softmax and log_softmax before torch 1.11**: their backward formulas took ``self`` (the
  input) as well as the result (``_softmax_backward_data(grad, result, dim, self)``), only
  for its dtype, so autograd kept the input alive until backward: one more tensor of the
  input's size per call (pytorch#49600, #64000; removed by #65242 for torch 1.11, which
  passes the input's dtype instead). For attention this is a ``[B, H, L, L]`` tensor per
  layer.

The trace makes the op's output hold its input: the input lives as long as the output's
storage, which the op's backward node keeps until backward runs (or the graph is freed).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

__all__ = ["OlderFormulas"]

_SOFTMAX = frozenset({"aten._softmax.default", "aten._log_softmax.default"})


class OlderFormulas:
    """Keeps what an older torch's backward formulas kept (see the module docstring).

    Args:
        torch_version: The target's torch ``(major, minor)``; ``None``: the installed one
            (nothing to add).
    """

    def __init__(self, torch_version: tuple[int, int] | None) -> None:
        self.softmax_keeps_input = torch_version is not None and torch_version < (1, 11)
        self.held = 0
        self._refs: dict[int, Any] = {}

    @property
    def active(self) -> bool:
        """Whether any older formula applies to the target."""
        return self.softmax_keeps_input

    def on_op(self, name: str, args: tuple[Any, ...], out: Any) -> None:
        """Called after each op of the trace."""
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

    def notes(self) -> list[str]:
        """What was kept."""
        if not self.held:
            return []
        return [
            f"the target's torch (before 1.11) keeps softmax's input for backward: {self.held} "
            "softmax / log_softmax call(s) hold their input until backward (pytorch#65242 "
            "removed it in 1.11)"
        ]
