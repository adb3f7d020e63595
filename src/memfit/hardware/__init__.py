"""What a device is, with sources: the GPU catalog, the CUDA context by runtime, CUDA's library
workspaces. Pure data and arithmetic: no torch, jax or pynvml import."""
