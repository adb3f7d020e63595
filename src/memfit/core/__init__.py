"""Pure planning: catalog, workloads, constraints, allocator model, budgets, memory families.

Nothing in ``memfit.core`` imports torch, jax or pynvml, ever (a test checks it).
"""
