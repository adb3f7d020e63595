"""The planner (pure: no torch, jax or pynvml import): workloads, their families' memory terms,
the rules over knobs, the budget a device leaves, the search and the plan.

The allocator model it uses is :mod:`memfit.allocator`; what a device is, :mod:`memfit.hardware`.
"""
