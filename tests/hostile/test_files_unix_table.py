"""The kernel's socket table (/proc/net/unix), as the hand-over reads it to see the
kubelet hang up: malformed, binary, oversized or missing tables never raise; only
well-formed connected lines of the server's own bound name count."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.adapters.deviceplugin import hangup

HEAD = b"Num       RefCount Protocol Flags    Type St Inode Path\n"
BOUND = "/var/lib/kubelet/device-plugins/.nvidia-gpu.sock.1234"
CONNECTED = b"0000000000000000: 00000003 00000000 00000000 0001 03 4242 " + BOUND.encode() + b"\n"
LISTENING = b"0000000000000000: 00000002 00000000 00010000 0001 01 4241 " + BOUND.encode() + b"\n"


def table(tmp_path: Path, body: bytes) -> str:
    path = tmp_path / "unix"
    path.write_bytes(HEAD + body)
    return str(path)


def test_only_connected_lines_of_the_bound_name_count(tmp_path: Path) -> None:
    junk = (
        b"\x00\xff garbage\n" + b"x " * 100_000 + b"\n" + b"a b c zz e f nothex " + BOUND.encode()
    )
    found = hangup.connections(BOUND, table(tmp_path, LISTENING + junk + b"\n" + CONNECTED))
    assert found == frozenset({4242})


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=4096))
def test_any_table_text_is_read_without_raising(
    tmp_path_factory: pytest.TempPathFactory, body: bytes
) -> None:
    path = tmp_path_factory.mktemp("t")
    found = hangup.connections(BOUND, table(path, body))
    assert found is not None


def test_an_oversized_or_missing_table_is_unreadable_not_an_error(tmp_path: Path) -> None:
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(hangup.TABLE_MAX_BYTES + 1)
    assert hangup.connections(BOUND, str(big)) is None
    assert hangup.connections(BOUND, str(tmp_path / "absent")) is None
