"""Why a step could not be traced: the error a user reads, with the phase, line and a hint."""

from __future__ import annotations

import re

from memfit.errors import EstimateError
from memfit.estimate.torch._fake_compat import locate_failure

__all__ = ["refusal"]

_NO_FAKE_RE = re.compile(
    r"no fake impl(?:ementation)? registered for <?(?:CustomOpDef\()?([\w:.]+)"
)


def _op_name(exc: BaseException) -> str:
    func = getattr(exc, "func", None)
    return str(func) if func is not None else type(exc).__name__


_STAND_IN_HINT = (
    "if the value only feeds logging, a progress bar or a check (as loss.item() inside a "
    "library's training loop), wrap that call in `with memfit.estimate.stand_in_scalars():` "
    "in your step: under the trace the read gives 0, and outside a trace nothing changes; if "
    "the value decides a shape, call the model's forward and loss in your own step instead "
    "of the code that reads it"
)
_SHAPE_HINT = (
    "fake tensors have shapes but no data, so an op whose output size depends on values "
    "(nonzero, unique, masked_select, boolean indexing) cannot be traced; compute such "
    "indices in make_batch (it may return them as tensors of a fixed size), or trace a step "
    "that calls the model's forward and loss directly instead of the library code that does "
    "this"
)
_NO_KERNEL_HINT = (
    "register a fake (meta) kernel for the op before estimating, with "
    "torch.library.register_fake('namespace::op') (this works for an op defined in a "
    "library too: the kernel only computes output shapes), or leave the op out of the traced "
    "step"
)
_BUILD_HINT = (
    "build() runs under fake tensors: it must create the model from code or a config, not "
    "load weights or data from files or from real tensors made before the trace (memory does "
    "not depend on the weights' values: build from the config, e.g. "
    "AutoModel.from_config(config), and load weights in the real run only)"
)


def refusal(exc: BaseException, phase: str) -> EstimateError:
    """The error for a failure under the trace: what, in which phase, where, and a hint."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedFakeTensorException,
        UnsupportedOperatorException,
    )

    where, in_library = locate_failure(exc, "run_trace")
    at = f" at {where}" if where else ""
    text = str(exc)
    op = _op_name(exc)
    building = phase == "build()"
    reads_value = (
        isinstance(exc, DataDependentOutputException) and "_local_scalar_dense" in op
    ) or ".numpy() is not supported for tensor subclasses" in text
    if reads_value:
        return EstimateError(
            f"{phase} reads a tensor's value to Python{at} (aten._local_scalar_dense: .item(), "
            "float(), bool(), .tolist() or .numpy()), which a fake-tensor trace cannot know",
            hint=_STAND_IN_HINT,
        )
    if isinstance(exc, (DynamicOutputShapeException, DataDependentOutputException)):
        return EstimateError(
            f"{phase} calls {op}{at}, whose output depends on tensor values, which a "
            "fake-tensor trace cannot know",
            hint=_BUILD_HINT if building else _SHAPE_HINT,
        )
    match = _NO_FAKE_RE.search(text)
    if isinstance(exc, UnsupportedOperatorException) or match is not None:
        name = match.group(1) if match is not None else op
        return EstimateError(
            f"operator {name} has no fake (meta) kernel, so {phase} cannot be traced{at}",
            hint=_NO_KERNEL_HINT,
        )
    if isinstance(exc, UnsupportedFakeTensorException) or (
        isinstance(exc, RuntimeError) and "doesn't have storage" in text
    ):
        return EstimateError(
            f"fake tensors cannot run {phase}{at}: {text}",
            hint=_BUILD_HINT if building else _NO_KERNEL_HINT,
        )
    lib = " (in a library it calls)" if in_library else ""
    return EstimateError(
        f"{phase} failed under the fake-tensor trace{at}{lib}: {type(exc).__name__}: {exc}",
        hint=(_BUILD_HINT + "; " if building else "")
        + "check that build/make_batch/step run as they are on this machine; rerun with "
        "--debug (or read the chained exception) for the traceback",
    )
