"""TokenReview and SubjectAccessReview, as the API server answers them: who a bearer token
is (authentication.k8s.io/v1), and whether a user may use a non-resource URL such as
/metrics (authorization.k8s.io/v1, RBAC's nonResourceURLs: an exact path, or a prefix
ending in *). Both are create-only, answered 201 with the review and its status."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuslice.testing.apiserver.status import invalid

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"  # noqa: S105 - a path
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
AUTHENTICATED = "system:authenticated"


@dataclass(frozen=True)
class User:
    name: str
    uid: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class _NonResourceGrant:
    subject: str  # a user or a group
    urls: tuple[str, ...]
    verbs: tuple[str, ...]

    def allows(self, user: str, groups: Iterable[str], path: str, verb: str) -> bool:
        return (
            (self.subject == user or self.subject in groups)
            and (verb in self.verbs or "*" in self.verbs)
            and any(u == path or (u.endswith("*") and path.startswith(u[:-1])) for u in self.urls)
        )


class Reviews:
    """The tokens the server knows and the non-resource grants (a ClusterRole with
    nonResourceURLs, bound to a user or group)."""

    def __init__(self) -> None:
        self.tokens: dict[str, User] = {}
        self.grants: list[_NonResourceGrant] = []

    def add_token(self, token: str, user: str, groups: Iterable[str] = ()) -> None:
        uid = f"uid-{len(self.tokens) + 1}"
        self.tokens[token] = User(user, uid, (*groups, AUTHENTICATED))

    def allow(self, subject: str, urls: Iterable[str], verbs: Iterable[str] = ("get",)) -> None:
        """Let `subject` (a user or group) use `urls` with `verbs`."""
        self.grants.append(_NonResourceGrant(subject, tuple(urls), tuple(verbs)))

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any] | None:
        if method != "POST" or path not in (TOKEN_REVIEWS, ACCESS_REVIEWS):
            return None
        spec = body.get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict):
            kind = "TokenReview" if path == TOKEN_REVIEWS else "SubjectAccessReview"
            return 422, invalid(kind, "", "spec", "", "Required value")
        status = self._token(spec) if path == TOKEN_REVIEWS else self._access(spec)
        return 201, {**body, "status": status}

    def _token(self, spec: dict[str, Any]) -> dict[str, Any]:
        user = self.tokens.get(str(spec.get("token") or ""))
        if user is None:
            return {"user": {}, "error": "[invalid bearer token, token lookup failed]"}
        info = {"username": user.name, "uid": user.uid, "groups": list(user.groups)}
        return {"authenticated": True, "user": info, "audiences": ["https://kubernetes.default"]}

    def _access(self, spec: dict[str, Any]) -> dict[str, Any]:
        attrs = spec.get("nonResourceAttributes") or {}
        user, groups = str(spec.get("user") or ""), [str(g) for g in spec.get("groups") or ()]
        path, verb = str(attrs.get("path") or ""), str(attrs.get("verb") or "")
        if any(g.allows(user, groups, path, verb) for g in self.grants):
            return {"allowed": True, "reason": "RBAC: allowed by a ClusterRoleBinding"}
        return {"allowed": False}
