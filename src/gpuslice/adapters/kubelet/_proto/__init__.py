"""Protobuf definitions of the kubelet APIs and their generated Python modules."""
