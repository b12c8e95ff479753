"""services.off_loop: a config read runs on a worker thread, bounded in time."""

from __future__ import annotations

import threading

import pytest

from gpuslice.core.errors import ConfigError
from gpuslice.services.off_loop import read_config


async def test_the_read_runs_off_the_loop_and_its_result_comes_back() -> None:
    loop_thread = threading.get_ident()
    assert await read_config(threading.get_ident) != loop_thread


async def test_a_read_past_its_bound_is_refused_like_a_bad_config() -> None:
    release = threading.Event()
    try:
        with pytest.raises(ConfigError, match=r"^reading the config took longer than 0.05s"):
            await read_config(lambda: release.wait(30), timeout_s=0.05)
    finally:
        release.set()


async def test_the_reads_own_error_comes_through() -> None:
    def bad() -> None:
        raise ConfigError("config.yaml: line 1: bad")

    with pytest.raises(ConfigError, match="line 1: bad"):
        await read_config(bad)
