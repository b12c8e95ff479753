"""gpuslice's testing kit: stand-ins for the outside systems the agent talks to.

The kubelet stand-in (gpuslice.testing.kubelet) speaks the real device-plugin gRPC
protocol over unix sockets and behaves as the kubelet's device manager does; the demo
and the tests use it. It is never a replacement for the kubelet.

The API server stand-in (gpuslice.testing.apiserver) serves the part of the Kubernetes
REST API the agent uses over real HTTP on 127.0.0.1, with a real API server's answers
(watches, conflicts, Event validation, RBAC enforcement); it needs only the standard
library.
"""
