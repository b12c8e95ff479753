"""Which resource names the admission policy refuses (deny) or warns about (warn) above 1 per
container: denied only when every config that may serve the name caps it."""

from __future__ import annotations

from gpuslice.core.admission import (
    DENY,
    WARN,
    CappedNames,
    admission_objects,
    capped_names,
    object_names,
)
from gpuslice.core.sharing import (
    MPS,
    NONE,
    TIME_SLICING,
    ReplicaRule,
    ResourceSettings,
    SharingPlan,
)

GPU, SHARED, MIG = "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb"


def config(
    *rules: ReplicaRule, fail: bool = True, strategy: str = TIME_SLICING
) -> ResourceSettings:
    return ResourceSettings(sharing=SharingPlan(strategy, rules, fail))


UNSHARED = ResourceSettings(sharing=SharingPlan(NONE))


def test_a_renamed_resource_capped_in_every_config_is_denied() -> None:
    renamed = config(ReplicaRule(GPU, 4, rename=SHARED))
    assert capped_names([renamed, UNSHARED]) == CappedNames(deny=(SHARED,))


def test_a_single_config_sharing_every_gpu_under_its_own_name_denies_it() -> None:
    assert capped_names([config(ReplicaRule(GPU, 4))]) == CappedNames(deny=(GPU,))
    assert capped_names([config(ReplicaRule(GPU, 2), strategy=MPS)]).deny == (GPU,)


def test_a_gpu_name_another_config_serves_whole_is_only_warned_about() -> None:
    """Training nodes serve nvidia.com/gpu whole: a pod asking for 2 is fine there."""
    assert capped_names([config(ReplicaRule(GPU, 4)), UNSHARED]) == CappedNames(warn=(GPU,))


def test_gpus_left_out_of_a_device_selection_stay_whole_under_the_name() -> None:
    partial = config(ReplicaRule(GPU, 4, devices=2))
    assert capped_names([partial]) == CappedNames(warn=(GPU,))
    listed = config(ReplicaRule(GPU, 4, devices=("0", "1")))
    assert capped_names([listed]) == CappedNames(warn=(GPU,))
    # Shared elsewhere under a new name, its own name keeps the unselected GPUs whole.
    split = config(ReplicaRule(GPU, 4, rename=SHARED, devices=2))
    assert capped_names([split]) == CappedNames(deny=(SHARED,))


def test_a_name_shared_without_the_cap_in_another_config_is_only_warned_about() -> None:
    capped = config(ReplicaRule(GPU, 4, rename=SHARED))
    uncapped = config(ReplicaRule(GPU, 8, rename=SHARED), fail=False)
    assert capped_names([capped, uncapped]) == CappedNames(warn=(SHARED,))


def test_nothing_is_capped_without_failRequestsGreaterThanOne() -> None:
    assert capped_names([config(ReplicaRule(GPU, 4), fail=False)]) == CappedNames()
    assert capped_names([UNSHARED]) == CappedNames()
    assert capped_names([]) == CappedNames()


def test_mig_profiles_follow_the_same_rule_as_whole_gpus() -> None:
    mixed = config(ReplicaRule(MIG, 2), ReplicaRule(GPU, 3, rename=SHARED))
    assert capped_names([mixed]) == CappedNames(deny=(SHARED, MIG))
    assert capped_names([mixed, UNSHARED]) == CappedNames(deny=(SHARED,), warn=(MIG,))


def test_the_objects_bind_one_policy_to_a_deny_and_a_warn_params_configmap() -> None:
    objects = admission_objects(CappedNames((SHARED, MIG), (GPU,)), name="gs", namespace="ns")
    names = object_names("gs")
    kinds = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert len(kinds) == 5
    for action, listed, mode in ((DENY, f"{SHARED},{MIG}", "Deny"), (WARN, GPU, "Warn")):
        params = kinds["ConfigMap", names[f"params-{action}"]]
        assert params["metadata"]["namespace"] == "ns"
        assert params["data"]["resources"] == listed
        binding = kinds["ValidatingAdmissionPolicyBinding", names[f"binding-{action}"]]["spec"]
        assert binding["policyName"] == names["policy"]
        assert binding["paramRef"] == {
            "name": params["metadata"]["name"],
            "namespace": "ns",
            "parameterNotFoundAction": "Allow",
        }
        assert binding["validationActions"] == [mode]
