"""The machine-type file (GFD's --machine-type-file, by default the DMI product name) is
read as an outside file: a FIFO there neither blocks nor is read, a file too large to be a
name is not read whole, and bytes that are not UTF-8 still give a name."""

from __future__ import annotations

import os
from pathlib import Path

from gpuslice.config.options import resolve_options
from gpuslice.wiring.host import MACHINE_TYPE_MAX_BYTES, host

MACHINE = host(resolve_options(command="run"))


def test_the_name_is_the_files_first_content_stripped(tmp_path: Path) -> None:
    path = tmp_path / "product_name"
    path.write_text("DGXA100 920-23687-2530-000\n")
    assert MACHINE.machine_type(str(path)) == "DGXA100 920-23687-2530-000"


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "product_name"
    os.mkfifo(fifo)  # no writer: an open for reading that waits would hang this test
    assert MACHINE.machine_type(str(fifo)) is None


def test_a_file_too_large_to_be_a_name_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "product_name"
    path.write_bytes(b"x" * (MACHINE_TYPE_MAX_BYTES + 1))
    assert MACHINE.machine_type(str(path)) is None


def test_bytes_that_are_not_utf8_still_give_a_name(tmp_path: Path) -> None:
    path = tmp_path / "product_name"
    path.write_bytes(b"Server \xff\xfe\n")
    assert MACHINE.machine_type(str(path)) == "Server \ufffd\ufffd"
