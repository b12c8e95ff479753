"""Labeller: oneshot, interval and infinite modes, timestamps, failures, sinks."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from gpuslice.adapters.fake import load_spec
from gpuslice.adapters.nfd_file import FeatureFile, parse
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import BackendError, HardwareError
from gpuslice.core.labels import TIMESTAMP_LABEL, node_labels
from gpuslice.core.sharing import MIG_SINGLE, ResourceSettings
from gpuslice.services.labeller import Labeller, LabelPolicy, NodeFeatureSink, snapshot_labels

T4 = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1"}
T4_SHARED = {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.count": "1"}


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Source:
    """Labels to hand out; a queued error is raised by the next call instead."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self.labels = dict(labels)
        self.errors: list[Exception] = []
        self.calls = 0

    async def __call__(self) -> Mapping[str, str]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.labels


class RecordingSink:
    """A LabelSink that keeps every publish; False when the labels equal the last ones."""

    def __init__(self, failures: int = 0) -> None:
        self.calls: list[dict[str, str]] = []
        self.stored: dict[str, str] | None = None
        self.removed = 0
        self.failures = failures
        self._cond = asyncio.Condition()

    async def publish(self, labels: Mapping[str, str]) -> bool:
        async with self._cond:
            self.calls.append(dict(labels))
            self._cond.notify_all()
        if self.failures:
            self.failures -= 1
            raise BackendError("API server unreachable", transient=True)
        changed = self.stored != dict(labels)
        self.stored = dict(labels)
        return changed

    async def remove(self) -> None:
        self.removed += 1

    async def until(self, count: int) -> None:
        async with self._cond:
            await asyncio.wait_for(self._cond.wait_for(lambda: len(self.calls) >= count), 5)


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Captured log entries at every level, whatever another test configured."""
    saved = structlog.get_config()
    with capture_logs() as captured:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
        yield captured
    structlog.configure(**saved)


@pytest.fixture
def feature_file(tmp_path: Path) -> FeatureFile:
    return FeatureFile(tmp_path / "features.d" / "gfd")


async def running(labeller: Labeller) -> AsyncIterator[asyncio.Event]:
    """Yield the stop event of a running labeller; stop it and wait on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(labeller.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


def path_of(sink: FeatureFile) -> Path:
    assert sink.path is not None
    return sink.path


def file_labels(sink: FeatureFile) -> dict[str, str]:
    return parse(path_of(sink).read_text())


# --- oneshot and timestamps --------------------------------------------------------------


async def test_oneshot_publishes_stamped_labels_to_every_sink_and_keeps_them(
    feature_file: FeatureFile,
) -> None:
    recorder = RecordingSink()
    labeller = Labeller(
        Source(T4), [feature_file, recorder], LabelPolicy(oneshot=True), clock=Clock(1700.9)
    )
    await labeller.run(asyncio.Event())
    expected = {**T4, TIMESTAMP_LABEL: "1700"}
    assert file_labels(feature_file) == expected
    assert recorder.calls == [expected]
    assert labeller.labels == expected
    assert recorder.removed == 0  # oneshot leaves its output in place


async def test_without_timestamps_no_timestamp_is_published() -> None:
    recorder = RecordingSink()
    source = Source({**T4, TIMESTAMP_LABEL: "5"})
    await Labeller(source, [recorder], LabelPolicy(oneshot=True, timestamps=False)).run(
        asyncio.Event()
    )
    assert recorder.calls == [T4]


async def test_the_labeller_owns_the_timestamp() -> None:
    recorder = RecordingSink()
    source = Source({**T4, TIMESTAMP_LABEL: "5"})
    await Labeller(source, [recorder], LabelPolicy(oneshot=True), clock=Clock(42)).run(
        asyncio.Event()
    )
    assert recorder.calls[0][TIMESTAMP_LABEL] == "42"


async def test_unchanged_labels_keep_their_timestamp_and_rewrite_nothing(
    feature_file: FeatureFile,
) -> None:
    clock, recorder = Clock(1000), RecordingSink()
    labeller = Labeller(Source(T4), [feature_file, recorder], clock=clock)
    assert await labeller.relabel()
    before = path_of(feature_file).stat()
    clock.now = 1060
    assert not await labeller.relabel()
    after = path_of(feature_file).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert [c[TIMESTAMP_LABEL] for c in recorder.calls] == ["1000", "1000"]


async def test_a_real_change_is_published_with_a_new_timestamp(feature_file: FeatureFile) -> None:
    clock, source, recorder = Clock(1000), Source(T4), RecordingSink()
    labeller = Labeller(source, [feature_file, recorder], clock=clock)
    await labeller.relabel()
    clock.now, source.labels = 1060, dict(T4_SHARED)
    assert await labeller.relabel()
    assert file_labels(feature_file) == {**T4_SHARED, TIMESTAMP_LABEL: "1060"}
    assert recorder.calls[-1] == {**T4_SHARED, TIMESTAMP_LABEL: "1060"}


# --- run modes ---------------------------------------------------------------------------


async def test_interval_mode_relabels_until_stopped_then_removes_the_file(
    feature_file: FeatureFile,
) -> None:
    recorder = RecordingSink()
    labeller = Labeller(Source(T4), [feature_file, recorder], LabelPolicy(interval_s=0.01))
    async for _stop in running(labeller):
        await recorder.until(3)
        assert path_of(feature_file).exists()
    assert not path_of(feature_file).exists()
    assert recorder.removed == 1


async def test_infinite_mode_labels_once_then_only_on_relabel(feature_file: FeatureFile) -> None:
    source, recorder = Source(T4), RecordingSink()
    labeller = Labeller(source, [feature_file, recorder], LabelPolicy(interval_s=None))
    async for _stop in running(labeller):
        await recorder.until(1)
        source.labels = dict(T4_SHARED)
        assert await labeller.relabel()
        assert source.calls == 2
    assert file_labels(feature_file)["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert recorder.removed == 0  # infinite mode leaves the file, as upstream


async def test_oneshot_raises_a_labelling_failure() -> None:
    source = Source(T4)
    source.errors.append(HardwareError("driver version '550' does not match X.Y[.Z]"))
    with pytest.raises(HardwareError, match="driver version"):
        await Labeller(source, [RecordingSink()], LabelPolicy(oneshot=True)).run(asyncio.Event())


async def test_a_failed_labelling_is_logged_and_retried_even_in_infinite_mode(
    logs: list[MutableMapping[str, Any]],
) -> None:
    source, recorder = Source(T4), RecordingSink()
    source.errors.append(HardwareError("driver version '550' does not match X.Y[.Z]"))
    labeller = Labeller(source, [recorder], LabelPolicy(interval_s=None, retry_s=0.01))
    async for _stop in running(labeller):
        await recorder.until(1)
    assert source.calls >= 2
    assert recorder.calls[0]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert any(e["event"] == "labels_failed" for e in logs)


async def test_a_failing_sink_does_not_stop_the_others_and_is_retried(
    feature_file: FeatureFile,
) -> None:
    flaky = RecordingSink(failures=1)
    labeller = Labeller(
        Source(T4), [flaky, feature_file], LabelPolicy(interval_s=None, retry_s=0.01)
    )
    with pytest.raises(BackendError, match="unreachable"):
        await labeller.relabel()
    assert file_labels(feature_file)["nvidia.com/gpu.product"] == "Tesla-T4"
    async for _stop in running(labeller):
        await flaky.until(2)
    assert flaky.stored == {**T4, TIMESTAMP_LABEL: flaky.calls[0][TIMESTAMP_LABEL]}


def test_intervals_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        Labeller(Source(T4), [], LabelPolicy(interval_s=0))
    with pytest.raises(ValueError, match="retry_s"):
        Labeller(Source(T4), [], LabelPolicy(retry_s=-1))
    with pytest.raises(ValueError, match="retry_max_s"):
        Labeller(Source(T4), [], LabelPolicy(retry_max_s=0))


async def test_retries_back_off_twice_as_long_each_time_up_to_the_cap(
    logs: list[MutableMapping[str, Any]],
) -> None:
    """The same reason again is logged at debug level only; recovery is logged."""
    flaky = RecordingSink(failures=4)
    labeller = Labeller(
        Source(T4), [flaky], LabelPolicy(interval_s=None, retry_s=0.01, retry_max_s=0.04)
    )
    async for _stop in running(labeller):
        await flaky.until(5)
        await asyncio.wait_for(labeller.wait_for(lambda: labeller.status()["ok"]), 5)
    failed = [e for e in logs if e["event"] == "labels_failed"]
    assert [e["retry_s"] for e in failed] == [0.01, 0.02, 0.04, 0.04]
    assert [e["log_level"] for e in failed] == ["error", "debug", "debug", "debug"]
    assert any(e["event"] == "labels_recovered" for e in logs)


async def test_status_says_how_publishing_stands() -> None:
    flaky, source = RecordingSink(failures=1), Source(T4)
    labeller = Labeller(source, [flaky], LabelPolicy(interval_s=None, retry_s=30))
    assert labeller.status() == {"ok": False, "detail": "not labelled yet"}
    async for _stop in running(labeller):
        await flaky.until(1)
        await asyncio.wait_for(labeller.wait_for(lambda: "next" in labeller.status()["detail"]), 5)
        assert labeller.status() == {
            "ok": False,
            "detail": "API server unreachable; next attempt in 30s",
        }
        source.labels = dict(T4_SHARED)
        labeller.nudge()  # a config change that changes the labels does not wait for the backoff
        await flaky.until(2)
        await asyncio.wait_for(labeller.wait_for(lambda: labeller.status()["ok"]), 5)
    assert labeller.status() == {"ok": True, "detail": f"{len(T4) + 1} labels published"}


async def test_a_nudge_relabels_in_the_background_in_infinite_mode() -> None:
    source, recorder = Source(T4), RecordingSink()
    labeller = Labeller(source, [recorder], LabelPolicy(interval_s=None))
    async for _stop in running(labeller):
        await recorder.until(1)
        source.labels = dict(T4_SHARED)
        labeller.nudge()  # returns at once; the loop publishes
        await recorder.until(2)
    assert recorder.calls[-1]["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"


class BrokenSink(RecordingSink):
    """Fails once with an error no sink should raise (not a GpusliceError)."""

    async def publish(self, labels: Mapping[str, str]) -> bool:
        first = not self.calls
        written = await super().publish(labels)
        if first:
            raise RuntimeError("unexpected\nanswer")
        return written


async def test_an_unexpected_sink_error_is_reported_and_retried_not_raised() -> None:
    sink = BrokenSink()
    labeller = Labeller(Source(T4), [sink], LabelPolicy(interval_s=None, retry_s=0.01))
    async for _stop in running(labeller):
        await sink.until(2)
        await asyncio.wait_for(labeller.wait_for(lambda: labeller.status()["ok"]), 5)
    direct = Labeller(Source(T4), [BrokenSink()], LabelPolicy(interval_s=None))
    with pytest.raises(RuntimeError):  # relabel() itself still raises it
        await direct.relabel()
    assert direct.status() == {"ok": False, "detail": "unexpected answer"}  # one line


# --- sources and the NodeFeature sink ----------------------------------------------------


async def test_snapshot_labels_computes_core_labels_and_logs_warnings_once(
    logs: list[MutableMapping[str, Any]],
) -> None:
    snapshot = load_spec("a100-40gb-mig-mixed")  # MIG enabled and disabled: invalid single
    settings = ResourceSettings(mig_strategy=MIG_SINGLE)

    async def read() -> tuple[HardwareSnapshot, ResourceSettings]:
        return snapshot, settings

    compute = snapshot_labels(read, machine="Test Machine")
    first = await compute()
    assert await compute() == first
    assert first == node_labels(snapshot, settings, machine="Test Machine")
    assert first["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"
    assert [e["event"] for e in logs] == ["label_warning"]


class FakeNodeApi:
    """The NodeFeature part of NodeApi: stores labels per (namespace, node)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, str]] = {}

    async def publish_node_feature(
        self, node: str, namespace: str, labels: Mapping[str, str]
    ) -> bool:
        key = (namespace, f"nvidia-features-for-{node}")
        if self.objects.get(key) == dict(labels):
            return False
        self.objects[key] = dict(labels)
        return True


async def test_node_feature_sink_publishes_through_the_node_api() -> None:
    api = FakeNodeApi()
    sink = NodeFeatureSink(api, "gpu-node-1", "gpu-operator")
    labeller = Labeller(Source(T4), [sink], clock=Clock(1000))
    assert await labeller.relabel()
    assert not await labeller.relabel()
    assert api.objects == {
        ("gpu-operator", "nvidia-features-for-gpu-node-1"): {**T4, TIMESTAMP_LABEL: "1000"}
    }
    await sink.remove()
    assert api.objects  # left for garbage collection through owner references


class Draws(random.Random):
    """A seeded Random that keeps every uniform() it drew."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draws: list[float] = []

    def uniform(self, a: float, b: float) -> float:
        value = super().uniform(a, b)
        self.draws.append(value)
        return value


async def test_every_interval_is_jittered_so_timers_restarted_together_drift_apart() -> None:
    """A cluster-wide switch restarts every node's timer at one instant: the next waits
    differ from node to node (up to 20 % either way), each drawn anew."""
    draws = Draws(5)
    source = Source(T4)
    labeller = Labeller(source, [RecordingSink()], LabelPolicy(interval_s=0.01), rand=draws)
    async for _stop in running(labeller):
        await asyncio.wait_for(labeller.wait_for(lambda: source.calls >= 4), 5)
    assert len(draws.draws) >= 3  # one per wait
    fleet = [Labeller(Source(T4), [], rand=random.Random(n)).jittered(60.0) for n in range(100)]
    assert all(48.0 <= wait <= 72.0 for wait in fleet)
    assert max(fleet) - min(fleet) > 20.0  # spread over seconds, not within 0.8 s


async def test_a_failing_sink_is_retried_on_backoff_and_logged_once_whatever_nudges_it(
    logs: list[MutableMapping[str, Any]],
) -> None:
    """NFD's CRD absent under DRA: the node's changes nudge the labeller often; the sink is
    asked again only as the backoff says, and each log line appears once per reason; the
    reason stays in status() (a readiness detail)."""
    sink, source = RecordingSink(failures=1000), Source(T4)
    labeller = Labeller(source, [sink], LabelPolicy(retry_s=60.0, interval_s=None))
    async for _ in running(labeller):
        await sink.until(1)
        await labeller.wait_for(lambda: not labeller.status()["ok"])
        for _ in range(5):
            seen = source.calls
            labeller.nudge()
            for _ in range(500):  # until the nudge was looked at (the labels computed)
                if source.calls != seen:
                    break
                await asyncio.sleep(0.01)
        assert len(sink.calls) == 1  # the retry is 60 s away: same labels do not hasten it
    errors = [e for e in logs if e["log_level"] in ("error", "warning")]
    assert [e["event"] for e in errors] == ["label_sink_failed", "labels_failed"]
    assert "API server unreachable" in labeller.status()["detail"]
