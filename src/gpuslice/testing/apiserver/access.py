"""Who may do what: the RBAC check the API server stand-in makes before serving a request.

A request becomes the attributes the real authorizer sees (verb, API group, resource,
namespace, name), and is allowed when one Grant covers them, as RBAC decides: a grant
without a namespace is a ClusterRole bound cluster-wide, one with a namespace a Role (or
ClusterRole) bound in that namespace only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuslice.testing.apiserver.status import status

_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "GET": "get"}


@dataclass(frozen=True)
class Access:
    """One request as the authorizer sees it ("" namespace: cluster-scoped)."""

    verb: str
    api_group: str
    resource: str  # with its subresource: pods/status
    namespace: str
    name: str

    @property
    def qualified(self) -> str:
        """The resource as API errors name it: nodes, nodefeatures.nfd.k8s-sigs.io."""
        plain = self.resource.split("/")[0]
        return f"{plain}.{self.api_group}" if self.api_group else plain


@dataclass(frozen=True)
class Grant:
    """Verbs on resources of one API group, cluster-wide (namespace None) or in one namespace,
    on the objects named in `names` only (RBAC's resourceNames) when it is not empty."""

    api_group: str
    resources: frozenset[str]
    verbs: frozenset[str]
    namespace: str | None = None
    names: frozenset[str] = frozenset()

    def allows(self, access: Access) -> bool:
        return (
            access.api_group == self.api_group
            and access.resource in self.resources
            and access.verb in self.verbs
            and (self.namespace is None or self.namespace == access.namespace)
            and (not self.names or access.name in self.names)
        )


def access_of(method: str, path: str, query: Mapping[str, str]) -> Access | None:
    """The attributes of a resource request; None for other paths (discovery, /version)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) > 2 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    resource = "/".join(rest[:1] + rest[2:3])
    name = rest[1] if len(rest) > 1 else ""
    verb = _VERBS.get(method, method.lower())
    if method == "GET" and not name:
        verb = "watch" if query.get("watch") in ("true", "1") else "list"
        # as the API server does: a list or watch of one name is authorized for that name
        selector = query.get("fieldSelector", "")
        if selector.startswith("metadata.name=") and "," not in selector:
            name = selector.removeprefix("metadata.name=")
    elif method == "DELETE" and not name:
        verb = "deletecollection"
    return Access(verb, group, resource, namespace, name)


def allowed(grants: Iterable[Grant], access: Access) -> bool:
    return any(grant.allows(access) for grant in grants)


def forbidden(access: Access, user: str) -> dict[str, Any]:
    """The 403 Status the API server answers, word for word in its format."""
    where = f'in the namespace "{access.namespace}"' if access.namespace else "at the cluster scope"
    why = (
        f'User "{user}" cannot {access.verb} resource "{access.resource}" '
        f'in API group "{access.api_group}" {where}'
    )
    subject = f'{access.qualified} "{access.name}"' if access.name else access.qualified
    details = {"name": access.name, "group": access.api_group, "kind": access.resource}
    return status(403, "Forbidden", f"{subject} is forbidden: {why}", details)
