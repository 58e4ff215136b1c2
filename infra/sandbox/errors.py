"""Errors of the rollout sandbox.

    SandboxError
    ├── SandboxUnavailable   no sandbox can be made here (bubblewrap missing, namespaces refused): says what to do
    └── PolicyError          the run file asks for a sandbox that cannot be built as asked (names the field)
"""

from __future__ import annotations

from infra.errors import InfraError


class SandboxError(InfraError):
    """Root of the sandbox's errors: one line, printed as is."""


class SandboxUnavailable(SandboxError):
    """bubblewrap is absent, or this machine refuses the namespaces it needs."""


class PolicyError(SandboxError):
    """A path, address or limit the sandbox cannot honour."""
