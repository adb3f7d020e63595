"""The JAX estimator: the user's step compiled by XLA, for the CPU or for a named CUDA card.

:mod:`~memfit.estimate.xla.step` compiles one step (``memfit.estimate_jax``);
:mod:`~memfit.estimate.xla.gpu` runs XLA's GPU compiler for a named card without the card (in
a child process, ``_gpu_child``); :mod:`~memfit.estimate.xla.runtime` adds what the JAX runtime
holds around a compiled program; :mod:`~memfit.estimate.xla.program` replays a training loop of
several jitted calls through XLA's BFC allocator; ``_pmap`` handles ``pmap``-ed steps. Nothing
here imports torch.
"""
