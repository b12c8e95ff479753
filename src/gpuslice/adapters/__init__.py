"""Adapters: one module or folder per outside system, the only place that talks to it."""
