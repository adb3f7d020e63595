"""The PyTorch estimator: the user's real step traced with fake tensors, under CUDA's rules.

:mod:`~memfit.estimate.torch.trace` is the entry point (``memfit.estimate_torch``); the
private modules beside it follow what CUDA does where the CPU trace cannot see it: the kernel
CUDA dispatches (``_cuda_kernels``, ``_cuda_probe``, ``_cuda_sdpa``, ``_autocast``), the
workspaces of cuDNN and cuBLAS (``_cuda_conv``, ``_cuda_blas``), the defaults of a CUDA
target (``_cuda_defaults``, ``_cuda_target``) and an older torch's formulas
(``_older_formulas``); and what the trace itself needs (``_tracer``, ``_fake_compat``,
``_refusal``, ``_measured_scratch``, ``_sequence``, ``_slope``, ``_summary``, ``_steady``).
Nothing here is imported by the JAX estimator.
"""
