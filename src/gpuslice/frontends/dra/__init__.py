"""The DRA kubelet-plugin front-end: prepares claims for the kubelet (driver), publishes
the node's ResourceSlices (publisher), and keeps its sockets served (frontend)."""
