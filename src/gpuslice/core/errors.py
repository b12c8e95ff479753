"""Error types raised by the core and translated at the edges."""


class GpusliceError(Exception):
    """Base of every error gpuslice raises on purpose."""


class ConfigError(GpusliceError):
    """A config a user wrote is invalid; the message is one line naming the field."""


class InvalidRequest(GpusliceError):  # noqa: N818 - the protocol term
    """A kubelet request that cannot be honoured (maps to INVALID_ARGUMENT)."""


class HardwareError(GpusliceError):
    """The hardware layout cannot be served under the chosen settings."""


class BackendError(GpusliceError):
    """The GPU backend failed; `transient` says whether a retry may help."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient
