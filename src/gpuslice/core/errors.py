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


class BadCheckpoint(BackendError):  # noqa: N818 - a kind of file, as NotFound
    """A checkpoint file whose content is not one (torn, corrupt, a checksum that does not
    match, a format this agent does not read): it is set aside and rebuilt."""


class SettingError(GpusliceError):
    """A value of one setting the core refuses. The core names the setting by the
    parameter it came in (`setting`), in words for str(); the command line names its flag
    instead (`named`, through config.flags.explain)."""

    def __init__(self, setting: str, words: str, problem: str, *, sep: str = ": ") -> None:
        super().__init__(f"{words}{sep}{problem}")
        self.setting, self.problem, self.sep = setting, problem, sep

    def named(self, name: str) -> str:
        """The message with `name` (a flag) for the setting."""
        return f"{name}{self.sep}{self.problem}"


class ConfigSettingError(SettingError, ConfigError):
    """A setting's value that is invalid on its own."""


class HardwareSettingError(SettingError, HardwareError):
    """A setting's value this node's hardware cannot serve."""
