"""A Kubernetes API server stand-in for tests and demos (see server.py): real HTTP on
127.0.0.1, stdlib only, with the real server's answers for what the agent does,
RBAC enforcement included. Never a replacement for an API server."""

from gpuslice.testing.apiserver.access import Access, Grant, access_of
from gpuslice.testing.apiserver.kubeconfig import TOKEN, write_kubeconfig
from gpuslice.testing.apiserver.server import (
    BAD_GZIP,
    GARBAGE,
    GZIP_BOMB,
    NFD,
    NODES,
    WAIT_S,
    FakeApiServer,
    Request,
)

__all__ = [
    "BAD_GZIP",
    "GARBAGE",
    "GZIP_BOMB",
    "NFD",
    "NODES",
    "TOKEN",
    "WAIT_S",
    "Access",
    "FakeApiServer",
    "Grant",
    "Request",
    "access_of",
    "write_kubeconfig",
]
