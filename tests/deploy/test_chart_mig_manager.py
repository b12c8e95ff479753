"""The chart follows MIG layouts by node label only when migManager.enabled is true: the
ConfigMap `migManager.config` mounted whole (its `..data` swap reaches the agent), its
`config.yaml` named by MIG_PARTED_CONFIG_FILE, and CAP_SYS_ADMIN for NVML's MIG calls."""

from __future__ import annotations

from chart_kit import VALUE_SETS, container, env, rendered, the

MOUNT = "/mig-parted-config"


def mig_config_maps(name: str) -> list[tuple[str, str, bool]]:
    objects = rendered(name)
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    return [
        (v["configMap"]["name"], mounts[v["name"]]["mountPath"], mounts[v["name"]]["readOnly"])
        for v in pod["volumes"]
        if v["name"] == "mig-parted-config"
    ]


def test_mig_manager_mounts_the_config_map_and_names_its_config_yaml() -> None:
    assert mig_config_maps("mig-manager") == [("default-mig-parted-config", MOUNT, True)]
    assert env(rendered("mig-manager"))["MIG_PARTED_CONFIG_FILE"] == f"{MOUNT}/config.yaml"
    mounts = container(rendered("mig-manager"))["volumeMounts"]
    assert all("subPath" not in m for m in mounts if m["name"] == "mig-parted-config")
    added = container(rendered("mig-manager"))["securityContext"]["capabilities"]["add"]
    assert added == ["SYS_ADMIN"]


def test_without_it_nothing_is_added() -> None:
    for name in set(VALUE_SETS) - {"mig-manager"}:
        assert mig_config_maps(name) == [], name
        assert "MIG_PARTED_CONFIG_FILE" not in env(rendered(name)), name
