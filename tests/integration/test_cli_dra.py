"""`gpuslice inspect --dra`: the ResourceSlices this node would publish, as they are sent
to the API server, and which front-end serves each resource."""

from __future__ import annotations

import json
from pathlib import Path

from process_harness import run_once

from gpuslice.core.dra.slices import API_VERSION


def inspect(*args: str) -> dict[str, object]:
    result = run_once("inspect", "--node-name", "n1", "--output", "json", *args)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_inspect_prints_the_slices_of_a_simulated_node() -> None:
    report = inspect("--fake-hardware", "a100-40gb-mig-mixed", "--mig-strategy", "mixed", "--dra")
    (only,) = report["resourceSlices"]
    assert only["apiVersion"] == API_VERSION
    assert only["kind"] == "ResourceSlice"
    assert only["metadata"] == {"name": "n1-gpu.nvidia.com-0"}
    spec = only["spec"]
    assert spec["driver"] == "gpu.nvidia.com"
    assert spec["nodeName"] == "n1"
    assert spec["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 1}
    names = [d["name"] for d in spec["devices"]]
    assert names[0] == "gpu-0000-00-04-0-mig-1g5gb-10-0"
    assert "gpu-0000-00-05-0" in names
    assert len(names) == 5
    assert set(report["frontEnds"].values()) == {"dra"}


def test_resources_kept_on_the_device_plugin_are_not_published(tmp_path: Path) -> None:
    report = inspect(
        "--fake-hardware", "a100-40gb-mig-mixed", "--mig-strategy", "mixed", "--dra",
        "--dra-device-plugin-resources", "nvidia.com/gpu", "--dra-driver-name", "gpu.example.com",
    )  # fmt: skip
    assert report["frontEnds"]["nvidia.com/gpu"] == "device-plugin"
    assert report["frontEnds"]["nvidia.com/mig-1g.5gb"] == "dra"
    (only,) = report["resourceSlices"]
    assert only["spec"]["driver"] == "gpu.example.com"
    assert all("-mig-" in d["name"] for d in only["spec"]["devices"])


def test_without_dra_nothing_of_it_is_printed_and_a_bad_driver_name_is_one_line() -> None:
    assert "resourceSlices" not in inspect("--fake-hardware", "t4")
    result = run_once("inspect", "--fake-hardware", "t4", "--dra", "--dra-driver-name", "GPU!")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "gpuslice: error: --dra-driver-name: 'GPU!' is not a DNS subdomain of at most 63 "
        "lower-case characters"
    )
    assert "Traceback" not in result.stderr


def test_mig_devices_are_published_whatever_the_mig_strategy() -> None:
    """As NVIDIA's DRA driver: a MIG-enabled GPU is published as its MIG devices with the
    default flags (migStrategy none), unless --dra-mig-devices=false says otherwise."""
    report = inspect("--fake-hardware", "a100-40gb-mig-mixed", "--dra")
    names = [d["name"] for d in report["resourceSlices"][0]["spec"]["devices"]]
    assert len(names) == 5
    assert sum("-mig-" in n for n in names) == 4
    assert "gpu-0000-00-04-0" not in names  # the MIG-enabled parent is not whole
    whole = inspect("--fake-hardware", "a100-40gb-mig-mixed", "--dra", "--dra-mig-devices=false")
    names = [d["name"] for d in whole["resourceSlices"][0]["spec"]["devices"]]
    assert names == ["gpu-0000-00-04-0", "gpu-0000-00-05-0"]


def test_inspect_shows_the_simulated_gpus_time_slice(tmp_path: Path) -> None:
    from gpuslice.adapters.fake import FakeBackend
    from gpuslice.adapters.fake.time_slices import FakeTimeSlices

    events = tmp_path / "events.jsonl"
    events.write_text("")
    uuid = FakeBackend.from_spec("t4").snapshot().gpus[0].uuid
    FakeTimeSlices(events).set_time_slice(uuid, "Medium")  # as the agent's prepare does
    report = inspect("--fake-hardware", "t4", "--fake-events", str(events))
    assert report["gpus"][0]["timeSlice"] == "Medium"
    assert "timeSlice" not in inspect("--fake-hardware", "t4")["gpus"][0]


def test_with_dynamic_mig_the_partitions_and_their_counters_are_shown() -> None:
    report = inspect("--fake-hardware", "dgx-h100", "--dra", "--dra-dynamic-mig")
    slices: list[dict] = report["resourceSlices"]  # type: ignore[assignment]
    counters = [s["spec"] for s in slices if "sharedCounters" in s["spec"]]
    assert [len(c["sharedCounters"]) for c in counters] == [8]  # 8 Hopper GPUs, one slice
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert all(len(s["spec"].get("devices", [])) <= 64 for s in slices)
    assert all(d["consumesCounters"] for d in devices)  # the whole GPUs consume them all
    assert "gpu-0000-1b-00-0-mig-7g80gb-0-0" in {d["name"] for d in devices}
    assert len(report["dynamicMigGpus"]) == 8  # type: ignore[arg-type]
    text = run_once("inspect", "--node-name", "n1", "--fake-hardware", "dgx-h100", "--dra",
                    "--dra-dynamic-mig").stdout  # fmt: skip
    assert "counter set gpu-0000-1b-00-0-counter-set" in text
