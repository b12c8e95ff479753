"""MemoryNodeApi beyond the shared contract: its test-side controls and inspection."""

from __future__ import annotations

from kube_fakes import Follower

from gpuslice.adapters.kube import objects
from gpuslice.testing.nodeapi import MemoryNodeApi, RecordedEvent

NS = "gpu-ops"


async def test_nodes_given_at_construction_are_readable() -> None:
    api = MemoryNodeApi({"n1": {"a": "1"}})
    assert await api.node_labels("n1") == {"a": "1"}


async def test_set_labels_wakes_a_waiting_watcher_with_each_change_in_order() -> None:
    api = MemoryNodeApi({"n1": {"a": "1"}})
    follower = Follower(api.watch_node_labels("n1"))
    assert await follower.next() == {"a": "1"}
    api.set_labels("n1", {"a": "2"})
    api.set_labels("n1", {"a": "1"})
    assert await follower.next() == {"a": "2"}
    assert await follower.next() == {"a": "1"}
    await follower.close()


async def test_changes_during_an_outage_arrive_as_the_latest_labels_once_reachable() -> None:
    api = MemoryNodeApi({"n1": {"a": "1"}})
    follower = Follower(api.watch_node_labels("n1"))
    await follower.next()
    api.set_reachable(False)
    api.set_labels("n1", {"a": "2"})
    api.set_labels("n1", {"a": "3"})
    api.set_reachable(True)
    assert await follower.next() == {"a": "3"}
    api.set_labels("n1", {"a": "4"})
    assert await follower.next() == {"a": "4"}
    await follower.close()


async def test_a_watcher_that_stopped_is_no_longer_fed() -> None:
    api = MemoryNodeApi({"n1": {"a": "1"}})
    watch = api.watch_node_labels("n1")
    assert await anext(watch) == {"a": "1"}
    await watch.aclose()
    api.set_labels("n1", {"a": "2"})
    assert api._watchers["n1"] == []


async def test_node_features_hold_the_same_objects_as_the_api_server_would() -> None:
    api = MemoryNodeApi()
    await api.publish_node_feature("n1", NS, {"a": "1"})
    await api.publish_node_feature("n1", NS, {"a": "2"})
    assert api.node_features == {
        (NS, "nvidia-features-for-n1"): objects.node_feature_body("n1", NS, {"a": "2"})
    }
    assert api.node_feature_labels("n1", NS) == {"a": "2"}
    assert api.node_feature_labels("n1", "elsewhere") is None
    assert api.writes == 2


async def test_events_keep_node_reason_message_and_type() -> None:
    api = MemoryNodeApi()
    await api.record_event("n1", "ConfigInvalid", "bad", warning=True)
    assert api.events == [RecordedEvent("n1", "ConfigInvalid", "bad", "Warning")]
