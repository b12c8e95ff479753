"""What sets one way of serving a device apart. Every caller asks these hooks instead
of comparing a strategy's name; the defaults are a device served as it is."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuslice.core.devices import Gpu
from gpuslice.core.response import Mount

Warn = Callable[[str], None]


class Strategy:
    name = ""  # in the sharing plan, the sharing-strategy label and inspect's "sharing"
    config_key = ""  # its block under `sharing:` in the v1 config ("" : none)
    config_attr = ""  # that block's field in config.v1.Sharing
    precedence = 0  # where several blocks are set, the highest is in force
    dra_name = ""  # its name as `sharing.strategy` of NVIDIA's opaque DRA config
    dra_config_field = ""  # its settings' field in that config's `sharing` ("" : none)
    dra_config_kind = "GpuConfig"  # the opaque config kind that applies to its devices
    shares = False  # one device's replicas go to several containers at once
    fail_requests_default = False  # failRequestsGreaterThanOne when the block omits it
    uniform_replicas = False  # every device of one resource has the same replicas
    product_suffix = ""  # the gpu.product suffix of a replicated, not renamed, resource
    daemon = False  # a control daemon per resource, under mpsRoot (its pipes, logs, shm)
    # a DRA claim asking for a daemon's sharing on such a device gets a daemon of its own
    claim_daemon = False
    pinned_memory = False  # its clients' pinned limits isolate memory where nothing else does
    memory_limits = True  # the driver can limit its devices' memory
    capable_label = ""  # a "<feature>.capable" label every node carries ("": none)

    def __repr__(self) -> str:
        return f"<strategy {self.name}>"

    def check_flags(
        self, mps_root: str | None, mig_mixed: bool, show: Callable[[object], str]
    ) -> None:
        """Refuse flags it cannot serve under (ConfigError): the MPS root, the mixed MIG
        strategy; `show` writes a value as the config's messages do."""

    def check_gpus(self, gpus: Sequence[Gpu]) -> None:
        """Refuse hardware it cannot serve (HardwareError)."""

    def capable(self, gpus: Sequence[Gpu], warn: Warn) -> bool:
        """The value of `capable_label` while it is the node's strategy."""
        return False

    def add_container_edits(
        self, resource: str, mps_root: str, envs: dict[str, str], mounts: list[Mount]
    ) -> None:
        """Add the env and mounts an Allocate answer gives a container of `resource`."""

    def dra_fields(self, sharing: Mapping[str, object], at: str) -> dict[str, Any]:
        """Its settings (`dra_config_field`) in an opaque DRA config's `sharing` object,
        as core.dra.opaque.SharingConfig fields (ConfigError)."""
        return {}

    def claim_problem(self, node: Strategy, device: str, mps_root: str) -> str:
        """Why a claim asking for this strategy cannot have `device`, which the node
        serves by `node` ("": it can)."""
        return ""
