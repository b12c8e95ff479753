"""Reading the agent's series back from Prometheus' HTTP API, for right-sizing."""

from gpuslice.adapters.prometheus.api import Limits, PrometheusApi, PrometheusError
from gpuslice.adapters.prometheus.gather import gather

__all__ = ["Limits", "PrometheusApi", "PrometheusError", "gather"]
