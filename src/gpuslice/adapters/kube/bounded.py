"""API answers read with a bound: a read's body (not a watch's: its lines are bounded
one by one in session._lines) may hold at most MAX_ANSWER_BYTES once decoded.

The bound sits in the HTTP transport every client is built with (bounded_transport: the
lightkube client's and the session's own, for watches), so every read is covered. gzip and
deflate bodies are inflated here, in steps that never produce more than the bytes left,
so a small compressed answer cannot grow past the bound either; any other content
coding is refused. An answer over the bound, or one that does not inflate, fails as
httpx2.DecodingError, which the session turns into a one-line transient error.
"""

from __future__ import annotations

import urllib.parse
import urllib.request
import zlib
from collections.abc import AsyncIterator

import httpx2
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig
from lightkube.config.models import User

# A Node with many images is some hundreds of KiB, a ConfigMap at most 1 MiB: 16 MiB is
# far above any answer the agent asks for, and far below what would hurt the node.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
_WBITS = {"gzip": 31, "deflate": 15}  # zlib's header detection for each coding


class _BoundedBody(httpx2.AsyncByteStream):
    def __init__(self, raw: httpx2.AsyncByteStream, coding: str, limit: int) -> None:
        self._raw, self._limit = raw, limit
        self._inflate = zlib.decompressobj(_WBITS[coding]) if coding else None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        left = self._limit
        async for chunk in self._raw:
            if self._inflate is not None:
                try:
                    chunk = self._inflate.decompress(chunk, left + 1)
                except zlib.error as exc:
                    raise httpx2.DecodingError(f"answer does not inflate: {exc}") from exc
                if self._inflate.unconsumed_tail:  # more than left + 1 bytes in this chunk
                    left = -1
            left -= len(chunk)
            if left < 0:
                raise httpx2.DecodingError(f"answer over {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._raw.aclose()


class BoundedTransport(httpx2.AsyncBaseTransport):
    """`inner`, with every non-watch answer bounded to `limit` decoded bytes."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int = MAX_ANSWER_BYTES) -> None:
        self._inner, self._limit = inner, limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if request.url.params.get("watch", "false") not in ("false", "0"):
            return response
        coding = response.headers.get("content-encoding", "").strip().lower()
        if coding not in ("", "identity", *_WBITS):
            await response.aclose()
            raise httpx2.DecodingError(f"answer in an unsupported content coding {coding!r}")
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        headers = [
            (k, v)
            for k, v in response.headers.multi_items()
            if k.lower() not in ("content-encoding", "content-length")
        ]
        return httpx2.Response(
            response.status_code,
            headers=headers,
            stream=_BoundedBody(response.stream, coding.replace("identity", ""), self._limit),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def bounded_transport(config: SingleConfig, limit: int = MAX_ANSWER_BYTES) -> BoundedTransport:
    """The transport every client of the session is built with: TLS as the kubeconfig
    says (lightkube's own verification), the environment's proxy for the API server (as
    httpx2 would choose it), and the bound on answers."""
    user = config.user or User()
    verify = verify_cluster(config.cluster, user, config.abs_file)
    inner = httpx2.AsyncHTTPTransport(verify=verify, proxy=_env_proxy(str(config.cluster.server)))
    return BoundedTransport(inner, limit)


def _env_proxy(server: str) -> str | None:
    """The proxy $HTTPS_PROXY, $HTTP_PROXY or $ALL_PROXY names for `server`, unless
    $NO_PROXY exempts it."""
    url = urllib.parse.urlsplit(server)
    if urllib.request.proxy_bypass(url.hostname or ""):
        return None
    proxies = urllib.request.getproxies_environment()
    return proxies.get(url.scheme) or proxies.get("all") or None
