"""metav1.Status bodies, as the API server writes them for a failed request."""

from __future__ import annotations

from typing import Any

REASONS = {
    200: "OK",
    400: "Bad Request",
    201: "Created",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    410: "Gone",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "message": message, "reason": reason}  # fmt: skip
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def not_found(qualified: str, name: str) -> dict[str, Any]:
    """A named object that does not exist: `nodes "n9" not found`."""
    kind = qualified.split(".")[0]
    return status(404, "NotFound", f'{qualified} "{name}" not found', {"name": name, "kind": kind})


def no_such_resource() -> dict[str, Any]:
    """A path the server does not serve, such as a custom resource whose CRD is not installed."""
    return status(404, "NotFound", "the server could not find the requested resource", {})


def invalid(kind: str, name: str, field: str, value: str, problem: str) -> dict[str, Any]:
    """422 for one invalid field, as validation reports it."""
    detail = f'Invalid value: "{value}": {problem}'
    cause = {"reason": "FieldValueInvalid", "message": detail, "field": field}
    return status(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {field}: {detail}',
        {"name": name, "kind": kind, "causes": [cause]},
    )


def write_refusal(
    method: str, qualified: str, name: str, body: dict[str, Any], stored: dict[str, Any] | None
) -> tuple[int, dict[str, Any]] | None:
    """409 for a create of an existing object or an update of a changed (or missing) one,
    as the API server answers them; None when the write may go ahead."""
    if method == "POST" and stored is not None:
        return 409, status(409, "AlreadyExists", f'{qualified} "{name}" already exists')
    if method == "PUT" and (
        stored is None
        or body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]
    ):
        message = (
            f'Operation cannot be fulfilled on {qualified} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again"
        )
        return 409, status(409, "Conflict", message)
    return None
