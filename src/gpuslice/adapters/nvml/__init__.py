"""The real GPU backend over NVML (nvidia-ml-py); the only importer of pynvml."""

from gpuslice.adapters.nvml.backend import NvmlBackend

__all__ = ["NvmlBackend"]
