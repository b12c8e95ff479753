"""The bound on API answers: a read's body passes whole up to the bound, compressed or
not, and fails one byte past it, measured on what is decoded; watches pass untouched
(their lines are bounded one by one); a coding that cannot be inflated in bounded steps
is refused."""

from __future__ import annotations

import gzip
import json
import zlib

import httpx2
import pytest

from gpuslice.adapters.kube.bounded import BoundedTransport

BODY = json.dumps({"data": "x" * 300_000}).encode()


def client(body: bytes, coding: str = "") -> httpx2.AsyncClient:
    headers = {"content-encoding": coding} if coding else {}
    answer = httpx2.MockTransport(lambda _: httpx2.Response(200, headers=headers, content=body))
    return httpx2.AsyncClient(transport=BoundedTransport(answer, len(BODY)))


@pytest.mark.parametrize(
    ("body", "coding"),
    [(BODY, ""), (gzip.compress(BODY), "gzip"), (zlib.compress(BODY), "deflate")],
)
async def test_an_answer_up_to_the_bound_is_read_whole(body: bytes, coding: str) -> None:
    answer = await client(body, coding).get("http://api/api/v1/nodes/n")
    assert answer.content == BODY


@pytest.mark.parametrize(
    ("body", "coding"),
    [
        (BODY + b" ", ""),
        (gzip.compress(BODY + b" "), "gzip"),
        (zlib.compress(BODY + b" "), "deflate"),
    ],
)
async def test_one_byte_past_the_bound_is_refused(body: bytes, coding: str) -> None:
    with pytest.raises(httpx2.DecodingError, match=f"answer over {len(BODY)} bytes"):
        await client(body, coding).get("http://api/api/v1/nodes/n")


async def test_a_watch_is_not_bounded_as_a_whole() -> None:
    answer = await client(BODY * 3).get("http://api/api/v1/nodes?watch=true")
    assert len(answer.content) == 3 * len(BODY)


async def test_a_coding_it_cannot_inflate_is_refused() -> None:
    with pytest.raises(httpx2.DecodingError, match="unsupported content coding 'br'"):
        await client(b"\x0b\x02\x80", "br").get("http://api/api/v1/nodes/n")
