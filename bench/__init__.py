"""gpuslice benchmarks: `python -m bench` (see docs/benchmarks.md)."""

import os

# gRPC core's own info lines (GOAWAY on a stopped baseline server) are not results.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
