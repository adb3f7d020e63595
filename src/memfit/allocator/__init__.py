"""The device allocators, modelled and configured: PyTorch's CUDA caching allocator
(:mod:`~memfit.allocator.model`), the snapshots it records (:mod:`~memfit.allocator.snapshot`)
and their replay (:mod:`~memfit.allocator.replay`), allocator settings for torch and JAX
(:mod:`~memfit.allocator.settings`) and XLA's pool fraction
(:mod:`~memfit.allocator.xla_fraction`). Pure: no torch, jax or pynvml import."""
