"""The chart adds what per-pod memory limits need only when memoryIsolation.enabled is true:
the flag, the host's cgroup tree read-only at its own path, and CAP_SYS_ADMIN."""

from __future__ import annotations

from chart_kit import VALUE_SETS, container, env, rendered, the


def cgroup_mounts(name: str) -> list[tuple[str, str, bool]]:
    objects = rendered(name)
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    return [
        (v["hostPath"]["path"], mounts[v["name"]]["mountPath"], mounts[v["name"]]["readOnly"])
        for v in pod["volumes"]
        if "hostPath" in v and v["hostPath"]["path"].startswith("/sys/fs/cgroup")
    ]


def test_memory_isolation_mounts_the_hosts_cgroup_tree_read_only_and_turns_the_flag_on() -> None:
    assert cgroup_mounts("memory-isolation") == [("/sys/fs/cgroup", "/sys/fs/cgroup", True)]
    assert env(rendered("memory-isolation"))["GPUSLICE_MEMORY_ISOLATION"] == "true"
    added = container(rendered("memory-isolation"))["securityContext"]["capabilities"]["add"]
    assert added == ["SYS_ADMIN"]


def test_without_it_nothing_is_added() -> None:
    for name in set(VALUE_SETS) - {"memory-isolation"}:
        assert cgroup_mounts(name) == [], name
        assert "GPUSLICE_MEMORY_ISOLATION" not in env(rendered(name)), name
