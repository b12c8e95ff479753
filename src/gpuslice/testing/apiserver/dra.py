"""resource.k8s.io/v1 in the API server stand-in: ResourceSlices (cluster-scoped: list
and watch with field selectors spec.nodeName and spec.driver, get, create, update with
the resourceVersion check, delete) and ResourceClaims (namespaced: get), with the checks the
real server makes that a driver can trip over: a slice's driver and pool name are
required, the pool's slice count must be positive, at most 128 devices go in a slice (64
when one carries taints or consumes counters, and 2 counter consumptions per device), and
shared counters go in slices without devices, at most 8 counter sets of 1 to 32 counters
each.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuslice.testing.apiserver.status import invalid, not_found, status, write_refusal
from gpuslice.testing.apiserver.watches import matches, selector

DRA = "/apis/resource.k8s.io/v1/"
SLICES = DRA + "resourceslices"
SLICE_QUALIFIED = "resourceslices.resource.k8s.io"
CLAIM_QUALIFIED = "resourceclaims.resource.k8s.io"


class DraObjects:
    """The stored slices and claims; `bump` gives the next resourceVersion, `record`
    tells the watches of a slice's change (kind ADDED, MODIFIED or DELETED)."""

    def __init__(
        self, bump: Callable[[], str], record: Callable[[str, str, dict[str, Any]], None]
    ) -> None:
        self._bump = bump
        self._record = record
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self._uids = itertools.count(1)

    # the cluster side

    def put_claim(
        self,
        namespace: str,
        name: str,
        results: Sequence[Mapping[str, Any]] = (),
        config: Sequence[Mapping[str, Any]] = (),
        *,
        uid: str | None = None,
        allocated: bool = True,
        annotations: Mapping[str, str] | None = None,
        requests: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """A ResourceClaim as the scheduler leaves it: allocated to `results` (each with
        request, driver, pool, device) with `config` copied into the allocation; the
        claim's own spec.devices.requests are `requests`."""
        uid = uid or f"claim-uid-{next(self._uids)}"
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid,
                                "resourceVersion": self._bump()}  # fmt: skip
        if annotations:
            meta["annotations"] = dict(annotations)
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": meta,
            "spec": {"devices": {"requests": [dict(r) for r in requests]}},
            "status": {},
        }
        if allocated:
            devices = {"results": [dict(r) for r in results], "config": [dict(c) for c in config]}
            claim["status"]["allocation"] = {"devices": devices}
        self.claims[(namespace, name)] = claim
        return claim

    def delete_slice(self, name: str) -> dict[str, Any]:
        """Delete a stored slice (a user, the kubelet, a garbage collector did)."""
        found = self.slices.pop(name)
        gone = {**found, "metadata": {**found["metadata"], "resourceVersion": self._bump()}}
        self._record(SLICES, "DELETED", gone)
        return found

    def delete_node_slices(self, node: str) -> list[str]:
        """What a starting kubelet does: delete every slice of its node; their names."""
        names = [s["metadata"]["name"] for s in self.node_slices(node)]
        for name in names:
            self.delete_slice(name)
        return names

    def edit_slice(self, name: str, edit: Callable[[dict[str, Any]], None]) -> None:
        """Change a stored slice in place (someone else's update)."""
        found = copy.deepcopy(self.slices[name])
        edit(found)
        found["metadata"]["resourceVersion"] = self._bump()
        self.slices[name] = found
        self._record(SLICES, "MODIFIED", found)

    def node_slices(self, node: str) -> list[dict[str, Any]]:
        return [s for s in self.slices.values() if s["spec"].get("nodeName") == node]

    def node_devices(self, node: str) -> dict[str, dict[str, Any]]:
        """Device name -> entry, over the node's slices of its newest pool generation."""
        slices = self.node_slices(node)
        newest = max((s["spec"]["pool"]["generation"] for s in slices), default=0)
        return {
            d["name"]: d
            for s in slices
            if s["spec"]["pool"]["generation"] == newest
            for d in s["spec"].get("devices", [])
        }

    # HTTP

    def route(
        self, method: str, path: str, query: Mapping[str, str], body: Any
    ) -> tuple[int, Any] | None:
        """The answer to a resource.k8s.io request; None for other paths."""
        if not path.startswith(DRA):
            return None
        parts = path[len(DRA) :].strip("/").split("/")
        if parts[0] == "resourceslices":
            return self._slices(method, parts[1] if len(parts) > 1 else None, query, body)
        if parts == ["resourceclaims"] and method == "GET":
            return 200, self._claim_page(query)
        if len(parts) == 4 and parts[0] == "namespaces" and parts[2] == "resourceclaims":
            if method != "GET":
                return 405, status(405, "MethodNotAllowed", "the stand-in only reads claims")
            found = self.claims.get((parts[1], parts[3]))
            return (200, found) if found else (404, not_found(CLAIM_QUALIFIED, parts[3]))
        return None

    def _claim_page(self, query: Mapping[str, str]) -> dict[str, Any]:
        """A list of claims in every namespace, paged as the API server pages (`limit`,
        and `continue` from the previous page)."""
        ordered = [self.claims[k] for k in sorted(self.claims)]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(ordered)
        items = ordered[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": self._bump()}
        if start + limit < len(ordered):
            meta["continue"] = str(start + limit)
        return {"kind": "ResourceClaimList", "apiVersion": "resource.k8s.io/v1",
                "metadata": meta, "items": items}  # fmt: skip

    def _slices(
        self, method: str, name: str | None, query: Mapping[str, str], body: Any
    ) -> tuple[int, Any]:
        if method == "GET" and name is None:
            wanted = selector(query.get("fieldSelector", ""))
            items = [s for s in self.slices.values() if matches(s, wanted)]
            meta = {"resourceVersion": self._bump()}
            return 200, {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                         "metadata": meta, "items": items}  # fmt: skip
        if method in ("GET", "DELETE"):
            found = self.slices.get(name or "")
            if found is None:
                return 404, not_found(SLICE_QUALIFIED, name or "")
            if method == "DELETE":
                self.delete_slice(name or "")
            return 200, found
        key = body["metadata"]["name"]
        stored = self.slices.get(key)
        refused = write_refusal(method, SLICE_QUALIFIED, key, body, stored)
        if refused is not None:
            return refused
        problem = _invalid(body)
        if problem is not None:
            return 422, invalid("ResourceSlice", key, *problem)
        body["metadata"]["resourceVersion"] = self._bump()
        self.slices[key] = body
        self._record(SLICES, "ADDED" if stored is None else "MODIFIED", body)
        return (201 if method == "POST" else 200), body


def _invalid(body: Mapping[str, Any]) -> tuple[str, str, str] | None:
    spec = body.get("spec", {})
    pool = spec.get("pool", {})
    devices = spec.get("devices") or []
    counters = spec.get("sharedCounters") or []
    limited = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    limit = 64 if limited else 128
    if not spec.get("driver"):
        return "spec.driver", "", "Required value"
    if not pool.get("name"):
        return "spec.pool.name", "", "Required value"
    if pool.get("resourceSliceCount", 0) < 1:
        return "spec.pool.resourceSliceCount", str(pool.get("resourceSliceCount")), "must be > 0"
    if devices and counters:
        return "spec", "", "only one of devices and sharedCounters can be set"
    if len(counters) > 8:
        return "spec.sharedCounters", str(len(counters)), "must have at most 8 items"
    for i, cs in enumerate(counters):
        if not cs.get("counters") or len(cs["counters"]) > 32:
            return f"spec.sharedCounters[{i}].counters", "", "must have 1 to 32 counters"
    if len(devices) > limit:
        return "spec.devices", str(len(devices)), f"must have at most {limit} items"
    for i, d in enumerate(devices):
        if len(d.get("consumesCounters") or []) > 2:
            return f"spec.devices[{i}].consumesCounters", "", "must have at most 2 items"
    return None
