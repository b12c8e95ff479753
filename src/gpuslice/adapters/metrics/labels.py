"""Label names shared by the series: dcgm-exporter's where the meaning is the same,
so a dashboard or a PromQL join written for one works with the other."""

from __future__ import annotations

GPU = ("gpu", "UUID", "modelName", "hostname")  # dcgm-exporter's GPU identity
CONTAINER = ("namespace", "pod", "container", "resource")  # as dcgm-exporter's pod mapping


def gpu_values(index: int | None, uuid: str, model: str, hostname: str) -> list[str]:
    return ["" if index is None else str(index), uuid, model, hostname]
