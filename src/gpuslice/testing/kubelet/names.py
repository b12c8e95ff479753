"""The kubelet's rules for a Register request: API version and resource name.

An extended resource name is domain-prefixed ("example.com/widget"), outside the
kubernetes.io namespace, does not start with "requests.", and "requests.<name>"
is a valid qualified name: a DNS-1123 subdomain prefix (lowercase, at most 253
characters) and a name part of at most 63 alphanumerics, '-', '_' or '.',
starting and ending with an alphanumeric.
"""

from __future__ import annotations

import re

from gpuslice.adapters.deviceplugin.api import API_VERSION

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_QUOTA_PREFIX = "requests."


def extended_resource_name_problem(name: str) -> str | None:
    """Why `name` is not a valid extended resource name, or None when it is."""
    if "/" not in name:
        return "it has no domain prefix"
    if "kubernetes.io/" in name:
        return "the kubernetes.io/ namespace is reserved for native resources"
    if name.startswith(_QUOTA_PREFIX):
        return f"it starts with {_QUOTA_PREFIX!r}"
    prefix, _, part = (_QUOTA_PREFIX + name).partition("/")
    if "/" in part:
        return "it has more than one '/'"
    if len(prefix) > 253 or not _SUBDOMAIN.fullmatch(prefix):
        return "its prefix is not a lowercase DNS subdomain"
    if len(part) > 63 or not _NAME_PART.fullmatch(part):
        return "its name part is not 1-63 alphanumerics, '-', '_' or '.'"
    return None


def is_extended_resource_name(name: str) -> bool:
    return extended_resource_name_problem(name) is None


def registration_problem(version: str, resource_name: str) -> str | None:
    """The kubelet's refusal text for a Register request, or None when it is acceptable."""
    if version != API_VERSION:
        return (
            f'requested API version "{version}" is not supported by kubelet. '
            f'Supported versions are ["{API_VERSION}"]'
        )
    problem = extended_resource_name_problem(resource_name)
    if problem is not None:
        return f'the ResourceName "{resource_name}" is invalid: {problem}'
    return None
