"""gpuslice: share NVIDIA GPUs between Kubernetes pods."""

__version__ = "0.1.0"
