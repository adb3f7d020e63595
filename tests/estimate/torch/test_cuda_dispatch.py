"""A CPU trace for a CUDA target dispatches every ATen operator as CUDA would (issue 42).

The registry walk: every operator with both a kernel CUDA runs whole and a
``CompositeImplicitAutograd`` kernel must reach the trace as one operator, never as the
composite's formula (``silu_backward`` was traced as five tensors where CUDA's fused kernel
makes one).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import memfit
from memfit.estimate.torch._cuda_dispatch import (
    MAY_DECOMPOSE,
    classify,
    cuda_kernel_composites,
    yaml_keys,
)
from memfit.estimate.torch._cuda_kernels import CudaKernels
from memfit.estimate.torch._cuda_probe import composite_op_names

A100 = "A100-SXM4-80GB"
MiB = 2**20


def _walked() -> tuple[Any, ...]:
    return cuda_kernel_composites(composite_op_names())


class _Seen(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace == "aten" and func.overloadpacket.__name__ not in ("detach", "view"):
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _sample(argument: Any, make: Any) -> Any:
    """A value for one schema argument: tensors (4, 8) float32 requiring grad, shapes [8]."""
    kind = str(argument.type)
    if kind.startswith(("Tensor", "Optional[Tensor]")):
        return make()
    if argument.has_default_value():
        return argument.default_value
    if kind.endswith("?") or kind.startswith("Optional["):
        return None
    if kind.startswith(("int[", "SymInt[", "List[int]", "List[SymInt]")):
        return [8]
    if kind in ("int", "SymInt"):
        return 1
    if kind == "float":
        return 1e-5
    if kind == "bool":
        return False
    raise AssertionError(f"no sample for an argument of type {kind}: add one here")


def test_the_walk_covers_the_found_case_and_each_op_is_classified_from_the_registry() -> None:
    walked = {d.name: d for d in _walked()}
    assert "aten::silu_backward" in walked  # the case issue 42 found
    for found in walked.values():
        assert found.composite and found.cuda_whole
    # an op CUDA decomposes is not in the walk; one with no composite neither
    assert classify("aten::dropout").kind == "composite"
    assert classify("aten::mm").kind == "cuda_kernel"
    assert classify("aten::silu_backward").kind == "cuda_kernel"


@pytest.mark.parametrize("name", [d.name for d in _walked()])
def test_every_op_with_a_cuda_kernel_and_a_composite_is_traced_whole(name: str) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    if name in MAY_DECOMPOSE:
        pytest.skip(MAY_DECOMPOSE[name])
    base, _, overload = name.removeprefix("aten::").partition(".")
    op = getattr(getattr(torch.ops.aten, base), overload or "default")
    kernels = CudaKernels((8, 0), (2, 6), 9)
    with FakeTensorMode():
        args = [
            _sample(a, lambda: torch.randn(4, 8, requires_grad=True))
            for a in op._schema.arguments
            if not a.kwarg_only
        ]
        seen = _Seen()
        with kernels, seen:
            op(*args)
    assert seen.ops and set(seen.ops) == {str(op)}, (name, seen.ops)
    assert kernels.kept_whole.get(str(op)) == 1 or classify(name).cpu_kernel


def test_the_reader_of_native_functions_agrees_with_the_registry() -> None:
    keys = yaml_keys()
    if not keys:
        pytest.skip("this torch ships no native_functions.yaml")
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")]
    checked = 0
    for name in names:
        found = keys.get(name.removeprefix("aten::"))
        if found is None:  # registered by hand (quantized RNNs), not in the file
            continue
        checked += 1
        for key in ("CompositeImplicitAutograd", "CPU"):
            registered = torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
            if key == "CPU" and not registered:
                continue  # a CPU kernel may be missing from a build (no MKL, no LAPACK)
            assert registered == (key in found), (name, key, sorted(found))
        if torch.version.cuda is not None:
            cuda = torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA")
            assert cuda == ("CUDA" in found), name
    assert checked > 2000


def _one_op_silu_backward() -> Any:
    def build() -> Any:
        return torch.nn.Module(), None

    def make_batch(rows: int) -> Any:
        return torch.randn(rows, 11008, dtype=torch.bfloat16, requires_grad=True)

    def step(_model: Any, _opt: Any, x: Any) -> None:
        y = torch.nn.functional.silu(x)
        y.backward(torch.ones_like(y))

    return build, step, make_batch


def test_silu_backward_is_one_kernel_for_a_cuda_target() -> None:
    # x, silu(x), the incoming gradient and the input's gradient: four (4096, 11008) bf16
    # tensors; the composite formula added its intermediates
    plain = memfit.estimate_torch(*_one_op_silu_backward(), [4096], steps=1)
    a100 = memfit.estimate_torch(*_one_op_silu_backward(), [4096], gpu=A100, steps=1)
    tensor = 4096 * 11008 * 2
    assert plain.points[0].allocated_peak == a100.points[0].allocated_peak
    assert a100.points[0].allocated_peak < 4 * tensor + MiB


@pytest.mark.parametrize("name", ["cuda-op-table", "cuda-arch-table"])
def test_the_guide_shows_the_generated_tables(name: str) -> None:
    from pathlib import Path

    from memfit.estimate.torch._cuda_arch import arch_table
    from memfit.estimate.torch._cuda_dispatch import op_table

    guide = Path(__file__).resolve().parents[3] / "docs" / "guide.md"
    text = guide.read_text()
    start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
    shown = text[text.index(start) + len(start) : text.index(end)]
    made = arch_table() if name == "cuda-arch-table" else op_table()
    assert shown == made, "regenerate them: python bench/cuda_op_table.py --write"


def test_dtype_notes_name_what_an_older_gpu_lacks() -> None:
    from memfit.estimate.torch._cuda_arch import ARCH_DTYPES, dtype_notes

    assert [r.tensor_cores_from for r in ARCH_DTYPES if r.dtype == "bfloat16"] == [(8, 0)]
    t4 = dtype_notes((7, 5), {"bfloat16", "float16"})
    assert len(t4) == 1 and t4[0].startswith("bfloat16 on sm_75")
    assert dtype_notes((8, 0), {"bfloat16"}) == []
    assert dtype_notes((6, 1), {"float16"})[0].startswith("float16 on sm_61")
    assert dtype_notes(None, {"bfloat16"}) == []


def test_the_dtype_rules_are_data_with_volta_and_turing_bf16_rows() -> None:
    from memfit.estimate.torch._cuda_arch import arch_name, dtype_rule
    from memfit.hardware.rules import rows

    t4, v100, a100 = (dtype_rule("bfloat16", c) for c in ((7, 5), (7, 0), (8, 0)))
    assert t4 is not None and v100 is not None and a100 is not None
    assert a100["native"] and not t4["native"] and not v100["native"]
    assert "cublasGemmEx" in t4["matmul"] and "assumed" in v100["matmul"]
    assert "math path" in t4["attention"]  # no fused attention for bf16 before sm_80
    # no row read so far allocates beyond a newer GPU's tensors
    assert all(
        r.value["extra_bytes"] == 0 for r in rows("cuda_arch") if r.rule.startswith("dtype.")
    )
    assert any("pytorch#57773" in r.source for r in rows("cuda_arch"))
    assert arch_name((7, 5)).startswith("Turing") and arch_name((7, 2)) == ""
    assert dtype_rule("float32", (7, 5)) is None


def test_coverage_counts_followed_and_assumed_operators() -> None:
    from memfit.estimate.torch._cuda_dispatch import coverage, known

    assert known("aten.native_group_norm_backward.default")[0]
    assert known("aten.mul.Tensor")[0]  # pointwise
    assert known("aten.view.default", torch.ops.aten.view.default)[0]
    assert known("aten.sort.default")[0]  # CUB radix sort
    assert known("aten.sum.dim_IntList")[0]  # gpu_reduce_kernel (_cuda_reduce)
    assert not known("aten._unique2.default")[0]
    met = {"aten.mul.Tensor": 3, "aten._unique2.default": 1, "aten.mm.default": 2}
    assert coverage(met) == (2, 1)
