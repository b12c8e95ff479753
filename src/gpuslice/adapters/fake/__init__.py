"""Simulated GPUs: built-in node profiles or YAML node files, with injected events."""

from gpuslice.adapters.fake.backend import FakeBackend
from gpuslice.adapters.fake.profiles import imex_channels, load_spec, profile_names, profile_text

__all__ = ["FakeBackend", "imex_channels", "load_spec", "profile_names", "profile_text"]
