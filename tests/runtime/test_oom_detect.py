"""memfit.is_oom: by type first, then one table of real messages; nothing else counts."""

from __future__ import annotations

import pytest
import torch

import memfit
from memfit.errors import OutOfMemory
from memfit.runtime import oom
from memfit.runtime.oom import forget_exception, is_oom, oom_message_kind

# Real messages, as users posted them (the GitHub issue each one comes from is named).
REAL_OOM_MESSAGES = [
    # Comfy-Org/ComfyUI#12366, taohan10200/IIM#28: driver-level failure, plain RuntimeError.
    (
        "cuda-driver",
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at "
        "some other API call, so the stacktrace below might be incorrect.\nFor debugging "
        "consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to "
        "enable device-side assertions.",
    ),
    # pytorch/pytorch#16417: the allocator's message from before torch.OutOfMemoryError.
    (
        "cuda-allocator",
        "CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; "
        "8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)",
    ),
    # open-mmlab/mmaction2#493 (it was memory: fewer videos per GPU fixed it).
    (
        "cudnn",
        "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
        "non-contiguous input.",
    ),
    # KupynOrest/DeblurGAN#128.
    ("cudnn", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    # Comfy-Org/ComfyUI#9529 (ROCm).
    (
        "hip",
        "HIP out of memory. Tried to allocate 432.00 MiB. GPU 0 has a total capacity of "
        "15.92 GiB of which 7.12 GiB is free. Of the allocated memory 8.08 GiB is allocated "
        "by PyTorch, and 321.96 MiB is reserved by PyTorch but unallocated.",
    ),
    # intel/intel-extension-for-pytorch#629.
    (
        "xpu",
        "XPU out of memory. Tried to allocate 1.71 GiB (GPU 0; 15.56 GiB total capacity; "
        "0 bytes already allocated; 0 bytes reserved in total by PyTorch)",
    ),
    # mxfold/mxfold2#20 (Linux).
    (
        "cpu-allocator",
        "[enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 132426121216 bytes. Error code 12 (Cannot allocate "
        "memory)",
    ),
    # IvanoLauriola/MKLpy#27 (Windows).
    (
        "cpu-allocator",
        "DefaultCPUAllocator: not enough memory: you tried to allocate 5077901088 bytes.",
    ),
]

NOT_OOM_MESSAGES = [
    "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
    "CUDA error: device-side assert triggered",
    "mat1 and mat2 shapes cannot be multiplied (64x16 and 32x4)",
    "Expected all tensors to be on the same device",
    "the memory of this machine is fine",
]


@pytest.mark.parametrize(("kind", "message"), REAL_OOM_MESSAGES)
def test_real_messages_in_plain_runtime_errors_are_oom(kind: str, message: str) -> None:
    assert is_oom(RuntimeError(message))
    assert oom_message_kind(message) == kind


@pytest.mark.parametrize("message", NOT_OOM_MESSAGES)
def test_other_runtime_errors_are_not_oom(message: str) -> None:
    assert not is_oom(RuntimeError(message))
    assert oom_message_kind(message) is None


def test_table_matches_only_runtime_errors() -> None:
    # The message table is for RuntimeError paths; a ValueError quoting it is not an OOM.
    assert not is_oom(ValueError("CUDA error: out of memory"))


def test_host_memory_error_is_oom_by_type() -> None:
    # Python's MemoryError is the host allocator's out-of-memory, whatever its message.
    assert is_oom(MemoryError())
    assert is_oom(MemoryError("Unable to allocate 8.00 GiB for an array"))


def test_types_come_first() -> None:
    assert is_oom(torch.OutOfMemoryError("anything at all"))
    assert is_oom(torch.cuda.OutOfMemoryError("alias"))
    assert is_oom(OutOfMemory("memfit gave up"))
    assert not is_oom(KeyboardInterrupt())
    assert memfit.is_oom is is_oom


def test_every_table_entry_has_a_real_message() -> None:
    assert {kind for kind, _ in oom.OOM_MESSAGES} == {kind for kind, _ in REAL_OOM_MESSAGES}


def test_forget_exception_clears_frames_and_chain() -> None:
    def fail() -> None:
        big = torch.zeros(10)  # a local the traceback would keep alive
        try:
            raise KeyError("first")
        except KeyError as inner:
            raise torch.OutOfMemoryError("second") from inner
        del big

    try:
        fail()
    except torch.OutOfMemoryError as exc:
        cause = exc.__cause__
        message = forget_exception(exc)
        assert message == "second"
        assert exc.__traceback__ is None and exc.__cause__ is None and exc.__context__ is None
        assert cause is not None and cause.__traceback__ is None
