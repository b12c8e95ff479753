"""gpuslice's testing kit: stand-ins for the outside systems the agent talks to.

The kubelet stand-in (gpuslice.testing.kubelet) speaks the real device-plugin gRPC
protocol over unix sockets and behaves as the kubelet's device manager does; the demo
and the tests use it. It is never a replacement for the kubelet.
"""
