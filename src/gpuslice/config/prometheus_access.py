"""How `gpuslice advise` reaches Prometheus: its URL and, for a secured one, a bearer
token file and TLS files, named as Prometheus' own HTTP client config names them."""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.config.flag_fields import fill, flag_field
from gpuslice.config.flags import FLAGS_BY_NAME, FlagValues
from gpuslice.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PrometheusAccess:
    url: str = flag_field("prometheus", str.strip)
    # authorization.credentials_file
    bearer_token_file: str = flag_field("prometheus-bearer-token-file")
    ca_file: str = flag_field("prometheus-ca-file")  # tls_config.ca_file
    cert_file: str = flag_field("prometheus-cert-file")  # tls_config.cert_file
    key_file: str = flag_field("prometheus-key-file")  # tls_config.key_file
    # tls_config.insecure_skip_verify
    insecure_skip_verify: bool = flag_field("prometheus-insecure-skip-verify")

    @property
    def tls(self) -> bool:
        """Whether a TLS setting is given."""
        return bool(self.ca_file or self.cert_file or self.key_file or self.insecure_skip_verify)


def named(flag: str) -> str:
    """A flag as errors name it: --flag (ENV)."""
    return f"--{flag} ({', '.join(FLAGS_BY_NAME[flag].env)})"


def prometheus_access(flags: FlagValues) -> PrometheusAccess:
    """The access the advise flags give; ConfigError naming the flag when they cannot
    work together (no URL, a certificate without its key, TLS files for http://)."""
    access = fill(PrometheusAccess, flags)
    if not access.url:
        raise ConfigError(
            f"{named('prometheus')}: give Prometheus' base URL, such as "
            "http://prometheus.monitoring:9090"
        )
    if bool(access.cert_file) != bool(access.key_file):
        raise ConfigError(
            f"{named('prometheus-cert-file')} and {named('prometheus-key-file')} go together: "
            "a client certificate is shown with its key"
        )
    if access.tls and not access.url.lower().startswith("https://"):
        raise ConfigError(
            "TLS settings (--prometheus-ca-file, --prometheus-cert-file, --prometheus-key-file, "
            f"--prometheus-insecure-skip-verify) need an https:// URL; --prometheus is "
            f"{access.url!r}"
        )
    return access
