"""Loading libnvidia-ml in a container: by name (the NVIDIA runtime injected it) or from the
host's driver root mounted at /driver-root; when neither has it, one line naming both fixes."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pynvml
import pytest
from nvml_fakes import FakeNvml

from gpuslice.adapters.fake.profiles import load_spec
from gpuslice.adapters.nvml import NvmlBackend
from gpuslice.adapters.nvml.backend import NVML_LIBRARY, load_nvml
from gpuslice.core.errors import BackendError


class Loader:
    """A stand-in for ctypes.CDLL: loads only the paths it is given, records every attempt."""

    def __init__(self, loadable: dict[str, object] | None = None) -> None:
        self.loadable = loadable or {}
        self.tried: list[str] = []

    def __call__(self, name: str) -> object:
        self.tried.append(name)
        if name in self.loadable:
            return self.loadable[name]
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")


def _nvml_loads_here() -> bool:
    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return False
    return True


def _assert_names_both_fixes(message: str) -> None:
    assert "\n" not in message
    assert message.startswith("NVML could not be loaded")
    assert NVML_LIBRARY in message
    assert "runtimeClassName: nvidia" in message
    assert "nvidiaDriverRoot" in message
    assert "/driver-root" in message or "driver root" in message


@pytest.mark.skipif(_nvml_loads_here(), reason="NVML loads on this machine")
def test_open_without_nvml_names_the_runtime_class_and_the_driver_root(tmp_path: Path) -> None:
    """The real pynvml path on a machine with no driver: the case of a pod run without
    the NVIDIA runtime and without the driver root mounted."""
    with pytest.raises(BackendError) as caught:
        NvmlBackend.open(driver_root=tmp_path / "driver-root")
    _assert_names_both_fixes(str(caught.value))
    assert "is not mounted" in str(caught.value)
    assert pynvml.nvmlLib is None  # nothing half-loaded is left behind


def test_the_library_is_loaded_by_name_first(tmp_path: Path) -> None:
    injected = object()
    loader = Loader({NVML_LIBRARY: injected})
    assert load_nvml(tmp_path, load=loader) is injected
    assert loader.tried == [NVML_LIBRARY]


@pytest.mark.parametrize(
    "libdir", ["usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu", "lib64"]
)
def test_a_mounted_driver_root_is_searched_when_the_name_does_not_load(
    tmp_path: Path, libdir: str
) -> None:
    path = tmp_path / libdir / NVML_LIBRARY
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    found = object()
    loader = Loader({str(path): found})
    assert load_nvml(tmp_path, load=loader) is found
    assert loader.tried == [NVML_LIBRARY, str(path)]


def test_an_empty_driver_root_names_where_it_looked(tmp_path: Path) -> None:
    loader = Loader()
    with pytest.raises(BackendError) as caught:
        load_nvml(tmp_path, load=loader)
    message = str(caught.value)
    _assert_names_both_fixes(message)
    assert f"nor under {tmp_path}" in message
    assert loader.tried == [NVML_LIBRARY]  # only files that exist are opened


def test_a_library_that_exists_but_does_not_load_is_named_with_its_error(tmp_path: Path) -> None:
    path = tmp_path / "usr/lib/x86_64-linux-gnu" / NVML_LIBRARY
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an ELF file")
    with pytest.raises(BackendError) as caught:
        load_nvml(tmp_path)  # the real ctypes.CDLL
    message = str(caught.value)
    _assert_names_both_fixes(message)
    assert str(path) in message


def test_an_nvml_that_reports_its_library_missing_gets_the_same_advice() -> None:
    with pytest.raises(BackendError) as caught:
        NvmlBackend.open(
            lib=FakeNvml(load_spec("t4"), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        )
    _assert_names_both_fixes(str(caught.value))


@pytest.mark.skipif(_nvml_loads_here(), reason="NVML loads here: the error cannot be provoked")
def test_the_agent_looks_for_nvml_where_driver_root_ctr_path_says(tmp_path: Path) -> None:
    """`gpuslice run` passes --driver-root-ctr-path (DRIVER_ROOT_CTR_PATH) to the NVML loader:
    the error names that mount point, not the default one."""
    from gpuslice.config.options import resolve_options
    from gpuslice.wiring.host import host

    root = tmp_path / "host-driver"
    root.mkdir()
    with pytest.raises(BackendError) as err:
        host(resolve_options(env={"DRIVER_ROOT_CTR_PATH": str(root)})).open_backend()
    assert str(root) in str(err.value)
    assert "/driver-root " not in str(err.value)
