"""The Prometheus adapter: the only place that imports prometheus_client."""

from gpuslice.adapters.metrics.accounting import AccountingCollector
from gpuslice.adapters.metrics.budget import BudgetCollector
from gpuslice.adapters.metrics.isolation import IsolationCollector
from gpuslice.adapters.metrics.prometheus import CONTENT_TYPE, PrometheusMetrics
from gpuslice.adapters.metrics.state import NodeSummaryCollector

__all__ = [
    "CONTENT_TYPE",
    "AccountingCollector",
    "BudgetCollector",
    "IsolationCollector",
    "NodeSummaryCollector",
    "PrometheusMetrics",
]
