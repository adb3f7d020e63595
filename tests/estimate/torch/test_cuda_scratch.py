"""What CUDA kernels take beyond their outputs, from torch's CUDA sources (issue 42)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import memfit
from memfit.estimate.torch._cuda_scratch import kernel_scratch

B200 = "B200"


def test_group_norm_backward_takes_float32_per_sample_and_channel_scratch() -> None:
    x = torch.empty(128, 64, 512, dtype=torch.bfloat16)
    w = torch.empty(64, dtype=torch.bfloat16)
    stats = torch.empty(128, 16)
    args = (x, x, stats, stats, w, 128, 64, 512, 16, [True, True, True])
    found = kernel_scratch("aten.native_group_norm_backward.default", args)
    assert found is not None
    # ds, db and c1 (N, C); c2, c3 (N, G); float32 for a bfloat16 input
    assert found.blocks == (128 * 64 * 4, 128 * 64 * 4, 128 * 16 * 4, 128 * 16 * 4, 128 * 64 * 4)
    no_dx = kernel_scratch(
        "aten.native_group_norm_backward.default", (*args[:9], [False, True, True])
    )
    assert no_dx is not None and no_dx.blocks == (128 * 64 * 4, 128 * 64 * 4)
    assert kernel_scratch("aten.mm.default", (x, x)) is None


def _group_norm(channels: int) -> Any:
    def build() -> Any:
        return nn.GroupNorm(channels // 4, channels), None

    def make_batch(n: int) -> Any:
        return torch.randn(n, channels, 512, requires_grad=True)

    def step(model: Any, _opt: Any, x: Any) -> None:
        model(x).sum().backward()

    return build, step, make_batch


def test_a_cuda_target_counts_group_norm_backward_scratch_and_reports_it() -> None:
    b200 = memfit.estimate_torch(*_group_norm(1024), [128], gpu=B200, steps=1)
    uses = b200.kernels["aten.native_group_norm_backward"]
    assert uses[0].workspace_bytes == int(3.5 * 128 * 1024 * 4)


def test_layer_norm_backward_copies_a_gradient_that_is_not_contiguous() -> None:
    x = torch.empty(4096, 1024, dtype=torch.bfloat16)
    expanded = torch.empty((), dtype=torch.bfloat16).expand(4096, 1024)
    stats = torch.empty(4096, 1)
    names = ("aten.native_layer_norm_backward.default", "aten._fused_rms_norm_backward.default")
    for name in names:
        found = kernel_scratch(name, (expanded, x, [1024], stats, stats))
        assert found is not None and found.blocks == (4096 * 1024 * 2,)  # dY.contiguous()
        assert kernel_scratch(name, (x, x, [1024], stats, stats)) is None  # nothing to copy


def test_embedding_backward_sorts_above_3072_indices() -> None:
    name = "aten.embedding_dense_backward.default"
    grad = torch.empty(8, 1024, 768, dtype=torch.bfloat16)
    many = torch.empty(8, 1024, dtype=torch.long)
    found = kernel_scratch(name, (grad, many, 50257, -1, False))
    assert found is not None
    n = 8 * 1024
    # six index-sized buffers, two counters, float32 per-segment sums
    assert found.blocks == (*[n * 8] * 6, 8, 8, n * 768 * 4)
    few = torch.empty(4, 512, dtype=torch.long)
    assert kernel_scratch(name, (torch.empty(4, 512, 768), few, 30522, -1, False)) is None


def test_sort_takes_cub_buffers_above_4096_per_row_by_segment_count() -> None:
    from memfit.estimate.torch._cuda_scratch import cub_sort_pairs_temp

    # up to 4096 per row: in place in shared memory
    assert kernel_scratch("aten.sort.default", (torch.empty(64, 4096), 1)) is None
    # many rows: segmented_sort_pairs, an int64 index and CUB's segmented storage
    many = kernel_scratch("aten.sort.default", (torch.empty(256, 8192), 1))
    n = 256 * 8192
    assert many is not None and many.blocks == (n * 8, n * (4 + 8))  # a third keys/values
    # under 128 rows: the full sort's two int2 buffers, a keys output and CUB's storage
    few = kernel_scratch("aten.sort.stable", (torch.empty(8, 8192, dtype=torch.half),), {"dim": 1})
    m = 8 * 8192
    assert few is not None and few.blocks == (m * 8, m * 8, m * 2, cub_sort_pairs_temp(m, 2, 8))
    # one row: an index row and one CUB call's storage
    one = kernel_scratch("aten.sort.default", (torch.empty(100_000),))
    assert one is not None and one.blocks == (100_000 * 8, cub_sort_pairs_temp(100_000, 4, 8))
    # sorting along a dimension that is not innermost copies the input and sorts into
    # temporaries first
    cols = kernel_scratch("aten.sort.default", (torch.empty(8192, 256), 0))
    assert cols is not None and cols.blocks[:3] == (n * 4, n * 4, n * 8)
    # CUB's alternates are the dominant part: keys and values once more
    assert n * 12 <= cub_sort_pairs_temp(n, 4, 8) <= n * 12 + n // 2 + 2**14


def test_index_put_with_accumulate_sorts_its_linear_index() -> None:
    from memfit.estimate.torch._cuda_scratch import cub_sort_pairs_temp

    grad = torch.empty(50_000, 512, device="meta")
    idx = torch.empty(8192, dtype=torch.long)
    values = torch.empty(8192, 512)
    name = "aten.index_put.default"
    found = kernel_scratch(name, (grad, [idx], values, True))
    assert found is not None
    # linear index, sorted, original positions, the arange, CUB's storage: nothing for
    # the values, which are already contiguous in the indexed shape
    assert found.blocks == (*[8192 * 8] * 4, cub_sort_pairs_temp(8192, 8, 8))
    assert kernel_scratch(name, (grad, [idx], values, False)) is None  # TensorIterator kernel
    # a broadcast value is expanded and made contiguous
    scalar = torch.empty(()).expand(8192, 512)
    expanded = kernel_scratch("aten.index_put_.default", (grad, [idx], scalar, True))
    assert expanded is not None and expanded.blocks[0] == 8192 * 512 * 4


def test_batch_norm_channels_last_training_stages_partial_sums() -> None:
    x = torch.empty(64, 256, 56, 56, device="meta").to(memory_format=torch.channels_last)
    w = torch.empty(256)
    found = kernel_scratch("aten.native_batch_norm.default", (x, w, w, w, w, True, 0.1, 1e-5))
    # flexible_launch_configs(64*56*56, 256): block 32 x 16, grid 8 x 128 (capped)
    assert found is not None and found.blocks == (4 * 256 * 128 * 4, 8 * 4)
    nchw = torch.empty(64, 256, 56, 56, device="meta")
    name = "aten.native_batch_norm.default"
    assert kernel_scratch(name, (nchw, w, w, w, w, True, 0.1, 1e-5)) is None
    assert kernel_scratch(name, (x, w, w, w, w, False, 0.1, 1e-5)) is None  # eval


def test_foreach_and_fused_optimizers_are_followed_with_nothing_beyond_outputs() -> None:
    from memfit.estimate.torch._cuda_dispatch import known

    for name in ("aten._foreach_addcmul_.Scalar", "aten._fused_adamw_.default"):
        followed, text = known(name)
        assert followed and "MultiTensorApply.cuh" in text
    assert not known("aten._unique2.default")[0]


def test_a_cuda_target_counts_the_backward_of_indexing() -> None:
    def build() -> Any:
        return nn.Linear(512, 512), None

    def make_batch(n: int) -> Any:
        return torch.randint(0, 4096, (n,))

    def step(model: Any, _opt: Any, idx: Any) -> None:
        model.weight[idx % 512].sum().backward()

    est = memfit.estimate_torch(build, step, make_batch, [8192], gpu="A100-SXM4-80GB", steps=1)
    uses = est.kernels["aten.index_put"]
    assert uses[0].workspace_bytes >= 8192 * 8 * 4


def test_batch_norm_channels_last_backward_keeps_sums_and_staging() -> None:
    x = torch.empty(64, 256, 56, 56, device="meta").to(memory_format=torch.channels_last)
    c = torch.empty(256)
    name = "aten.native_batch_norm_backward.default"
    found = kernel_scratch(name, (x, x, c, c, c, c, c, True, 1e-5, [True, True, True]))
    # sumn_dy, sum_dy_xmu; 2 x C x grid.y staging values and grid.x semaphores
    assert found is not None and found.blocks == (256 * 4, 256 * 4, 2 * 256 * 128 * 4, 8 * 4)
    nchw = torch.empty(64, 256, 56, 56, device="meta")
    assert kernel_scratch(name, (nchw, nchw, c, c, c, c, c, True, 1e-5, [True] * 3)) is None


def test_cumsum_of_a_mask_converts_it_and_one_row_takes_cub_storage() -> None:
    from memfit.estimate.torch._cuda_scratch import cub_scan_temp

    mask = torch.empty(64, 4096, dtype=torch.bool, device="meta")
    found = kernel_scratch("aten.cumsum.default", (mask, 1))
    assert found is not None and found.blocks == (64 * 4096 * 8,)  # self.to(int64)
    row = torch.empty(1_000_000, device="meta")
    one = kernel_scratch("aten.cumsum.default", (row, 0))
    assert one is not None and one.blocks == (cub_scan_temp(1_000_000, 4),)
    assert cub_scan_temp(1_000_000, 4) < 1_000_000 * 4 // 10  # tile states: a few percent
    assert kernel_scratch("aten.cumsum.default", (torch.empty(64, 4096, device="meta"), 1)) is None
    half = torch.empty(64, 4096, dtype=torch.half, device="meta")
    wide = kernel_scratch("aten.cumsum.default", (half, 1), {"dtype": torch.float32})
    assert wide is not None and wide.blocks == (64 * 4096 * 4,)


def test_topk_sorts_a_few_long_rows_whole() -> None:
    x = torch.empty(4, 200_000, device="meta")
    found = kernel_scratch("aten.topk.default", (x, 10))
    n = 4 * 200_000
    sort = kernel_scratch("aten.sort.default", (x, 1))
    assert found is not None and sort is not None
    assert found.blocks == (n * 4, n * 8, *sort.blocks)
    assert kernel_scratch("aten.topk.default", (torch.empty(4096, 1000, device="meta"), 10)) is None


def test_kernels_that_take_inputs_contiguous_copy_those_that_are_not() -> None:
    logits = torch.empty(1000, 512, device="meta").t()  # (512, 1000), not contiguous
    for name in ("aten._softmax.default", "aten._log_softmax.default"):
        found = kernel_scratch(name, (logits, 1, False))
        assert found is not None and found.blocks == (512 * 1000 * 4,)
        assert kernel_scratch(name, (logits.contiguous(), 1, False)) is None
    target = torch.empty(512, dtype=torch.long, device="meta")
    found = kernel_scratch("aten.nll_loss_forward.default", (logits, target, None, 1, -100))
    assert found is not None and found.blocks == (512 * 1000 * 4,)


def test_backward_formulas_write_into_their_zeros_tensor_as_the_real_run_does() -> None:
    # gather's backward is new_zeros(...).scatter_add_(...) for real tensors; the fake
    # tensors of the trace take the out-of-place branch (areAnyTensorSubclassLike), which
    # would count a second tensor of the input's size
    rows, cols = 8192, 64

    def build() -> Any:
        return nn.Linear(1, 1), None

    def make_batch(n: int) -> Any:
        return torch.randn(n, cols, requires_grad=True), torch.randint(0, cols, (n, 1))

    def step(_model: Any, _opt: Any, batch: Any) -> None:
        x, idx = batch
        x.gather(1, idx).sum().backward()

    est = memfit.estimate_torch(build, step, make_batch, [rows], steps=1, kernel_scratch=False)
    x = rows * cols * 4
    # the input, its gradient (the zeros tensor written in place) and the small index
    assert 2 * x <= est.points[0].tensor_peak < 2 * x + x // 4


def test_gradients_of_a_tensor_used_twice_are_summed_in_place() -> None:
    # the autograd engine sums the two gradients x receives in place (InputBuffer::accumulate,
    # old_var.add_(var)); with fake tensors it runs old_var + var, one tensor more
    n = 1 << 20

    def build() -> Any:
        return nn.Linear(1, 1), None

    def make_batch(size: int) -> Any:
        return torch.randn(size, requires_grad=True)

    def step(_model: Any, _opt: Any, x: Any) -> None:
        ((x * 2).sum() + (x * 3).sum()).backward()

    est = memfit.estimate_torch(build, step, make_batch, [n], steps=1, kernel_scratch=False)
    x = n * 4
    # the input and the two gradients, summed into one of them
    assert 3 * x <= est.points[0].tensor_peak < 3 * x + x // 4
