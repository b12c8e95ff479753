"""Front-ends: each tells the kubelet about the node's devices in one API
(core.ports.FrontEnd over core.ports.NodeView). A new one is a new package here plus
its lines in wiring; front-ends never import each other, services or adapters."""
