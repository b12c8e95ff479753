"""MPS control daemons: one per MPS resource, with the limits each client gets.

Pure: what each daemon needs (its GPUs, directories, per-client limits and the
commands that set them), and the refusals. As upstream: a client's pinned device
memory is the GPU's memory divided by its replicas (or a size the user gives), its
active thread percentage 100 / replicas, and a GPU takes at most 48 clients (16 below
compute capability 7.5). MPS on MIG-enabled GPUs and without mpsRoot are refused by
the strategy (core.strategies.mps) where the resources and the config are built. A DRA
claim asking for MPS on MIG devices gets a daemon of its own, `<mpsRoot>/dra-claims/<uid>`,
which the node's daemons leave alone.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuslice.core.devices import Gpu
from gpuslice.core.errors import HardwareError, HardwareSettingError
from gpuslice.core.resources import Resource

CLAIMS = "dra-claims"  # the domain of the DRA claims' own daemons: <mpsRoot>/dra-claims/<uid>


def claim_resource(claim_uid: str) -> str:
    """The name of a claim's own daemon, as a resource's: its directory under mpsRoot."""
    return f"{CLAIMS}/{claim_uid}"


def of_claim(root: str, mps_root: str) -> bool:
    """Whether the daemon directory `root` under `mps_root` is a DRA claim's own."""
    return posixpath.relpath(root, mps_root).split("/")[0] == CLAIMS


def max_clients(compute_capability: tuple[int, int]) -> int:
    """Upstream's cap on MPS clients per GPU: 48 from compute capability 7.5, else 16."""
    return 48 if compute_capability >= (7, 5) else 16


@dataclass(frozen=True)
class DaemonPlan:
    """One resource's control daemon; `ordinals` are GPU positions in CUDA_VISIBLE_DEVICES."""

    resource: str
    root: str  # <mpsRoot>/<resource>
    gpu_uuids: tuple[str, ...]  # in NVML index order
    pinned_mib: tuple[int, ...]  # per ordinal
    thread_percentage: int

    @property
    def pipe_dir(self) -> str:
        return posixpath.join(self.root, "pipe")

    @property
    def log_dir(self) -> str:
        return posixpath.join(self.root, "log")

    @property
    def shm_dir(self) -> str:
        return posixpath.join(self.root, "shm")

    @property
    def env(self) -> dict[str, str]:
        return {
            "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir,
            "CUDA_MPS_LOG_DIRECTORY": self.log_dir,
            "CUDA_VISIBLE_DEVICES": ",".join(self.gpu_uuids),
        }

    def set_commands(self) -> list[str]:
        lines = [
            f"set_default_device_pinned_mem_limit {i} {mib}M"
            for i, mib in enumerate(self.pinned_mib)
        ]
        return [*lines, f"set_default_active_thread_percentage {self.thread_percentage}"]

    def mismatches(self, pinned: Sequence[str], threads: str) -> list[str]:
        """What the daemon answered to get_default_* that differs from the plan."""
        wrong = [
            f"GPU ordinal {i}: pinned memory limit {got!r}, want {want}M"
            for i, (got, want) in enumerate(zip(pinned, self.pinned_mib, strict=True))
            if _mib(got) != want
        ]
        if _number(threads) != self.thread_percentage:
            wrong.append(f"active thread percentage {threads!r}, want {self.thread_percentage}")
        return wrong


def plan_daemons(
    resources: Iterable[Resource],
    gpus: Sequence[Gpu],
    mps_root: str,
    *,
    pinned_limit_mib: int = 0,
) -> tuple[DaemonPlan, ...]:
    """A daemon per MPS resource. `pinned_limit_mib` > 0 replaces memory / replicas.
    Raises HardwareError when a GPU is asked for more clients than MPS allows, or for a
    pinned limit above its memory."""
    by_uuid = {g.uuid: g for g in gpus}
    plans = []
    for res in resources:
        if not res.serving.daemon or not res.replicated or not mps_root:
            continue
        used = sorted((by_uuid[u] for u in res.devices_per_gpu), key=lambda g: g.index)
        for gpu in used:
            replicas, cap = res.devices_per_gpu[gpu.uuid], max_clients(gpu.compute_capability)
            if replicas > cap:
                raise HardwareError(
                    f"sharing.mps: {res.name} has {replicas} replicas of GPU {gpu.index} "
                    f"({gpu.name}, compute capability {gpu.compute_capability[0]}."
                    f"{gpu.compute_capability[1]}); MPS allows at most {cap} clients per GPU"
                )
            if pinned_limit_mib > gpu.memory_mib:
                raise HardwareSettingError(
                    "pinned_limit_mib",
                    "the MPS pinned memory limit",
                    f"{pinned_limit_mib} (MiB) for {res.name} is more than GPU {gpu.index} "
                    f"({gpu.name}) has: {gpu.memory_mib} MiB",
                    sep=" ",
                )
        replicas = max(res.devices_per_gpu.values())  # one count per resource (config rule)
        plans.append(
            DaemonPlan(
                resource=res.name,
                root=posixpath.join(mps_root, res.name),
                gpu_uuids=tuple(g.uuid for g in used),
                pinned_mib=tuple(
                    pinned_limit_mib or g.memory_mib // res.devices_per_gpu[g.uuid] for g in used
                ),
                thread_percentage=100 // replicas,
            )
        )
    return tuple(plans)


def _number(text: str) -> float | None:
    try:
        return float(text.strip().rstrip("%"))
    except ValueError:
        return None


def _mib(text: str) -> int | None:
    """'1024M', '1G' or '1024' (MiB) as MiB."""
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}.get(text[-1:])
    value = _number(text[:-1] if scale is not None else text)
    return None if value is None else round(value * (scale or 1))


@dataclass(frozen=True)
class RunningDaemon:
    """A control daemon found running in a resource's pipe directory."""

    root: str
    pid: int
    # The GPUs it was started with, as recorded when gpuslice started it; None when no
    # record matches it (started by someone else, or the record was lost).
    gpu_uuids: tuple[str, ...] | None


def keeps(running: RunningDaemon, plan: DaemonPlan) -> bool:
    """Whether `running` can serve `plan` as it is: a daemon's GPUs are fixed when it
    starts (CUDA_VISIBLE_DEVICES); its limits are not (set_default_* on the daemon)."""
    return running.root == plan.root and running.gpu_uuids == plan.gpu_uuids


def server_commands(plan: DaemonPlan, server: str) -> list[str]:
    """The limits of `plan` for the new clients of a running server (MPS applies
    set_default_* only to servers started after them)."""
    lines = [
        f"set_device_pinned_mem_limit {server} {i} {mib}M" for i, mib in enumerate(plan.pinned_mib)
    ]
    return [*lines, f"set_active_thread_percentage {server} {plan.thread_percentage}"]


def pids(text: str) -> tuple[str, ...]:
    """The PIDs in an answer of get_server_list or get_client_list, one a line."""
    return tuple(w for w in text.split() if w.isdigit())
