"""Reaching a secured Prometheus: the bearer token read from its file (bounded, on each
request, as Prometheus' own client reads credentials_file), the TLS context built from
a CA bundle and a client certificate (each file bounded before it is loaded), and a
TLS failure said in one line with what to give."""

from __future__ import annotations

import re
import ssl

from gpuslice.adapters.outside_files import read_text, reason
from gpuslice.config.prometheus_access import PrometheusAccess, named
from gpuslice.core.errors import GpusliceError

MAX_TOKEN = 64 << 10  # a service account's JWT is about 1 KiB
MAX_PEM = 4 << 20  # a CA bundle of every public root is about 200 KiB
_SOURCE = re.compile(r"\s*\(_ssl\.c:\d+\)")  # where in CPython's C an SSL error arose


class AccessError(GpusliceError):
    """A credential or TLS file that cannot be used."""


def bearer_token(path: str) -> str:
    """The token in the file, without surrounding whitespace; AccessError when it is
    missing, too large, empty or holds what an HTTP header cannot carry."""
    try:
        token = read_text(path, limit=MAX_TOKEN).strip()
    except OSError as exc:
        raise AccessError(
            f"{named('prometheus-bearer-token-file')} {path}: {reason(exc)}"
        ) from None
    if not token or not token.isascii() or not token.isprintable():
        why = "is empty" if not token else "holds characters a token cannot have"
        raise AccessError(f"{named('prometheus-bearer-token-file')} {path}: {why}")
    return token


def tls_context(access: PrometheusAccess) -> ssl.SSLContext:
    """The context an https:// request goes with: the system's CAs or the bundle given,
    and the client certificate when one is given."""
    bundle = _pem("prometheus-ca-file", access.ca_file) if access.ca_file else None
    try:
        context = ssl.create_default_context(cadata=bundle)
    except ssl.SSLError as exc:
        raise AccessError(
            f"{named('prometheus-ca-file')} {access.ca_file}: not a CA bundle ({_words(exc)})"
        ) from None
    if access.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if access.cert_file:
        _pem("prometheus-cert-file", access.cert_file)
        _pem("prometheus-key-file", access.key_file)
        try:
            context.load_cert_chain(access.cert_file, access.key_file)
        except (ssl.SSLError, OSError) as exc:
            raise AccessError(
                f"{named('prometheus-cert-file')} {access.cert_file} with "
                f"{named('prometheus-key-file')} {access.key_file}: not a certificate and "
                f"its key ({_words(exc)})"
            ) from None
    return context


def tls_failure(exc: ssl.SSLError, access: PrometheusAccess) -> str:
    """What a failed TLS exchange means, and what to give."""
    said = _words(exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        trusted = f"the CAs of {access.ca_file}" if access.ca_file else "the system's CAs"
        return (
            f"its certificate is not trusted ({exc.verify_message}): it is not signed by "
            f"{trusted}; name the CA that signed it with {named('prometheus-ca-file')}"
        )
    if "CERTIFICATE_REQUIRED" in said.upper() or (
        "HANDSHAKE_FAILURE" in said.upper() and not access.cert_file
    ):
        return (
            f"it asks for a client certificate ({said}): give {named('prometheus-cert-file')} "
            f"and {named('prometheus-key-file')}"
        )
    if "UNKNOWN_CA" in said.upper() or "BAD_CERTIFICATE" in said.upper():
        return f"it refused the client certificate {access.cert_file} ({said})"
    if isinstance(exc, ssl.SSLEOFError):  # TLS 1.3: a refusal may close before its alert
        if access.cert_file:
            return (
                f"it refused the client certificate {access.cert_file}, or ended the TLS "
                f"exchange for another reason ({said})"
            )
        return (
            f"it asks for a client certificate, or ended the TLS exchange for another "
            f"reason ({said}): give {named('prometheus-cert-file')} and "
            f"{named('prometheus-key-file')}"
        )
    return f"TLS failed ({said})"


def _pem(flag: str, path: str) -> str:
    """The file's text: bounded, a regular file, PEM."""
    try:
        text = read_text(path, limit=MAX_PEM)
    except OSError as exc:
        raise AccessError(f"{named(flag)} {path}: {reason(exc)}") from None
    if "-----BEGIN " not in text:
        raise AccessError(f"{named(flag)} {path}: not PEM (no -----BEGIN line)")
    return text


def _words(exc: BaseException) -> str:
    return " ".join(_SOURCE.sub("", str(exc)).split())[:200]
