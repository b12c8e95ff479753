"""The Kubernetes API adapter: the agent's Node, its NFD NodeFeature, Node Events and
the ConfigMap of per-node configs.

KubeNodeApi talks to a real API server through lightkube (session.py is the only
module that imports lightkube, and only once a KubeNodeApi is built); it implements
gpuslice.core.ports.NodeApi, as does the testing kit's in-memory MemoryNodeApi.
rbac.py holds the RBAC rules the agent needs.
"""

from gpuslice.adapters.kube.node_api import KubeNodeApi
from gpuslice.adapters.kube.objects import NODE_FEATURE_PREFIX, NODE_NAME_LABEL, OwnerRef

__all__ = [
    "NODE_FEATURE_PREFIX",
    "NODE_NAME_LABEL",
    "KubeNodeApi",
    "OwnerRef",
]
