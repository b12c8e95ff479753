"""Property: whatever bytes a client sends, the status endpoint's request reader returns
a path or refuses the request in one line (414 / 431), within its bounds, never raising
anything else; and a live server answers every such request or closes it, and keeps
serving."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.adapters import status_http
from gpuslice.adapters.status_http import MAX_LINE, StatusServer

LINE = st.binary(max_size=2 * MAX_LINE).filter(lambda b: b"\n" not in b)
REQUESTS = st.one_of(
    st.binary(max_size=4 * MAX_LINE),
    st.lists(LINE, max_size=120).map(lambda lines: b"\r\n".join(lines) + b"\r\n\r\n"),
    st.builds(
        lambda path, headers: b"GET " + path + b" HTTP/1.1\r\n" + b"".join(headers) + b"\r\n",
        LINE,
        st.lists(LINE.map(lambda h: h + b"\r\n"), max_size=150),
    ),
)


REFUSALS = ("414 URI Too Long", "431 Request Header Fields Too Large")


async def _parse(data: bytes) -> tuple[str, str]:
    """(path, "") or (refusal status, its one-line reason)."""
    reader = asyncio.StreamReader(limit=MAX_LINE)
    reader.feed_data(data)
    reader.feed_eof()
    try:
        path, authorization = await status_http._read_request(reader)
        assert authorization is None or len(authorization) <= MAX_LINE
        return path, ""
    except status_http._TooLargeError as exc:
        return exc.status, str(exc)


@settings(max_examples=300, deadline=None)
@given(REQUESTS)
def test_any_bytes_give_a_path_or_a_one_line_refusal(data: bytes) -> None:
    first, reason = asyncio.run(_parse(data))
    if reason:
        assert first in REFUSALS
        assert "\n" not in reason
    else:
        assert len(first) <= MAX_LINE


async def _exchange_all(requests: list[bytes]) -> list[bytes]:
    async with StatusServer("127.0.0.1:0", lambda: (True, {}), timeout_s=2.0) as server:
        answers = []
        for request in requests:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            try:
                writer.write(request)
                writer.write_eof()
                answers.append(await asyncio.wait_for(reader.read(), 5))
            except ConnectionError:
                answers.append(b"")
            finally:
                writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
        answers.append(await asyncio.wait_for(reader.read(), 5))
        writer.close()
        return answers


@settings(max_examples=20, deadline=None)
@given(st.lists(REQUESTS, min_size=1, max_size=5))
def test_a_live_server_answers_any_bytes_and_keeps_serving(requests: list[bytes]) -> None:
    *answers, last = asyncio.run(_exchange_all(requests))
    assert last.startswith(b"HTTP/1.1 200")
    for answer in answers:
        assert answer == b"" or answer.startswith(b"HTTP/1.1 ")
