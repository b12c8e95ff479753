"""The Kubernetes API adapter: the agent's Node, its NFD NodeFeature, Node Events and
the ConfigMap of per-node configs.

KubeNodeApi talks to a real API server through lightkube (session.py is the only
module that imports lightkube, and only once a KubeNodeApi is built);
MemoryNodeApi is the in-memory stand-in for tests, the demo and fake-cluster runs.
Both implement gpuslice.core.ports.NodeApi. rbac.py holds the RBAC rules the agent needs.
"""

from gpuslice.adapters.kube.memory import MemoryNodeApi, RecordedEvent
from gpuslice.adapters.kube.node_api import KubeNodeApi
from gpuslice.adapters.kube.objects import NODE_FEATURE_PREFIX, NODE_NAME_LABEL, OwnerRef

__all__ = [
    "NODE_FEATURE_PREFIX",
    "NODE_NAME_LABEL",
    "KubeNodeApi",
    "MemoryNodeApi",
    "OwnerRef",
    "RecordedEvent",
]
