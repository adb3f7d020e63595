"""What a device is, with sources: the GPU catalog, the CUDA context by runtime, CUDA's library
workspaces, XLA's GPU target configs. Pure data and arithmetic: no torch, jax or pynvml import."""
