"""A bounded client of Prometheus' HTTP API (instant queries).

Every answer is bounded: a deadline for the whole request (not only each socket read),
at most Limits.max_body bytes, JSON nesting bounded by the decoder (a deeper answer is
refused, not a RecursionError), and a fixed shape: an answer that is not Prometheus'
{"status": ..., "data": {"resultType": "vector", "result": [...]}} is one error line
naming the URL. A redirect is not followed. A secured Prometheus is reached with a
bearer token and TLS files (secured.py); a refusal (HTTP 401 or 403, or a failed TLS
exchange) is one line saying what to give.
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.client import HTTPException, HTTPResponse
from typing import Generic, TypeVar

import msgspec

from gpuslice.adapters.prometheus.secured import bearer_token, tls_context, tls_failure
from gpuslice.config.prometheus_access import PrometheusAccess, named
from gpuslice.core.errors import GpusliceError

T = TypeVar("T")
READ_CHUNK = 1 << 20


class PrometheusError(GpusliceError):
    """Prometheus could not be read, or what answered is not Prometheus."""


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_s: float = 30.0  # per request, all of it
    max_body: int = 64 << 20  # bytes of one answer
    max_series: int = 20_000  # container series one advice reads
    # samples one query makes Prometheus evaluate (series x steps): well under its own
    # --query.max-samples (50 million by default)
    max_samples: int = 20_000_000


class _Data(msgspec.Struct, Generic[T]):
    resultType: str  # noqa: N815 - the API's name
    result: T


class _Answer(msgspec.Struct, Generic[T]):
    status: str
    data: _Data[T] | None = None
    error: str = ""
    errorType: str = ""  # noqa: N815 - the API's name


class _Sample(msgspec.Struct):
    metric: dict[str, str]
    value: tuple[float, str]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer like any other (not Prometheus'), never followed
    (urllib would follow one to ftp://)."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_VECTOR = msgspec.json.Decoder(_Answer[list[_Sample]])

Labels = dict[str, str]


class PrometheusApi:
    def __init__(self, access: PrometheusAccess | str, limits: Limits = Limits()) -> None:
        """`access`: the URL and credentials (a plain URL: none). Raises PrometheusError
        for a URL that is not http(s), GpusliceError for a TLS file that cannot be used."""
        self.access = access if isinstance(access, PrometheusAccess) else PrometheusAccess(access)
        url = self.access.url
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(f"--prometheus {url!r}: expected an http:// or https:// URL")
        self.url = url.rstrip("/")
        self.limits = limits
        self.requests = 0
        handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
        if parsed.scheme == "https":
            handlers.append(urllib.request.HTTPSHandler(context=tls_context(self.access)))
        self._opener = urllib.request.build_opener(*handlers)

    def instant(self, query: str, at: float) -> list[tuple[Labels, str]]:
        """An instant query at `at`: (labels, value as Prometheus wrote it) per series."""
        found = self._get("query", {"query": query, "time": _num(at)}, _VECTOR, "vector")
        return [(s.metric, s.value[1]) for s in found]

    def scalar_count(self, query: str, at: float) -> int:
        """The value of a query of one series (count(...)); 0 when it has none."""
        found = self.instant(query, at)
        if not found:
            return 0
        try:
            return int(float(found[0][1]))
        except (ValueError, OverflowError):
            raise PrometheusError(f"{self.url}: {query} is not a count: {found[0][1]!r}") from None

    def _get(
        self,
        path: str,
        params: dict[str, str],
        decoder: msgspec.json.Decoder[_Answer[T]],
        kind: str,
    ) -> T:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        self.requests += 1
        body, status, ctype = self._fetch(url)
        if status in (401, 403):
            raise self._refused(status)
        if "json" not in ctype:
            raise self._not_prometheus(f"HTTP {status}, content-type {ctype or 'none'!r}")
        try:
            answer = decoder.decode(body)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise self._not_prometheus(str(exc)) from None
        if answer.status == "error":
            why = " ".join(f"{answer.errorType}: {answer.error}".split())[:300]
            raise PrometheusError(f"{self.url} refused the query ({why}): {params['query']}")
        if answer.status != "success" or answer.data is None:
            raise self._not_prometheus(f"status {answer.status[:40]!r}")
        if answer.data.resultType != kind:
            raise self._not_prometheus(f"a {answer.data.resultType[:40]!r} result, not {kind}")
        return answer.data.result

    def _fetch(self, url: str) -> tuple[bytes, int, str]:
        deadline = time.monotonic() + self.limits.timeout_s
        headers = {"Accept": "application/json"}
        if self.access.bearer_token_file:  # read again each time, as Prometheus does
            headers["Authorization"] = f"Bearer {bearer_token(self.access.bearer_token_file)}"
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 - http(s) only, checked in __init__
        reply: HTTPResponse | urllib.error.HTTPError
        try:
            reply = self._opener.open(request, timeout=self.limits.timeout_s)
        except urllib.error.HTTPError as exc:  # Prometheus answers 400/422/503 with JSON
            reply = exc
        except (urllib.error.URLError, OSError, HTTPException, ValueError) as exc:
            cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(cause, ssl.SSLError):
                why = tls_failure(cause, self.access)
                raise PrometheusError(f"cannot reach Prometheus at {self.url}: {why}") from None
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {cause}") from None
        try:
            with reply:
                ctype = reply.headers.get_content_type() if reply.headers else ""
                return self._body(reply, deadline), reply.status or 0, ctype
        except (OSError, HTTPException) as exc:
            raise PrometheusError(f"{self.url} broke off its answer: {exc}") from None

    def _body(self, reply: HTTPResponse | urllib.error.HTTPError, deadline: float) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"{self.url} did not answer within {self.limits.timeout_s:g} s"
                )
            chunk = reply.read1(READ_CHUNK)
            if not chunk:
                return b"".join(parts)
            size += len(chunk)
            if size > self.limits.max_body:
                raise PrometheusError(
                    f"{self.url} answered more than {self.limits.max_body:,} bytes for one "
                    "query; narrow it (--namespace, a shorter --window or a longer --step)"
                )
            parts.append(chunk)

    def _refused(self, status: int) -> PrometheusError:
        token = self.access.bearer_token_file
        if status == 403:
            why = "HTTP 403 Forbidden: the credentials given are not allowed to query it"
        elif token:
            why = f"HTTP 401 Unauthorized: it does not accept the bearer token of {token}"
        else:
            why = (
                "HTTP 401 Unauthorized: it asks for credentials; give "
                f"{named('prometheus-bearer-token-file')}"
            )
        return PrometheusError(f"{self.url} refused the query: {why}")

    def _not_prometheus(self, why: str) -> PrometheusError:
        why = " ".join(why.split())[:200]
        return PrometheusError(f"{self.url} does not answer as Prometheus' HTTP API ({why})")


def _num(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")
