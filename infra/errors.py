"""Errors of the local infrastructure launchers.

    InfraError
    ├── PrerequisiteMissing  a system tool (java 17+, mvn) is absent: one line says which
    ├── FetchFailed          Maven could not fetch the broker's jars
    ├── PortInUse            another process holds a port the broker needs
    ├── BrokerStartFailed    the broker process exited or never answered a metadata request
    ├── BrokerBusy           the operation needs the broker stopped (wiping its data)
    └── ImageError           the images cannot be built or run here (infra/images): the message says why
"""


class InfraError(Exception):
    """Root of the launchers' errors; the CLI prints the message as one line."""


class PrerequisiteMissing(InfraError):
    """A system tool is absent or too old."""


class FetchFailed(InfraError):
    """Maven failed; the message carries its last lines."""


class PortInUse(InfraError):
    """Starting would fail on a port held by someone else."""


class BrokerStartFailed(InfraError):
    """The broker died, never answered, or answered as another cluster."""


class BrokerBusy(InfraError):
    """The broker must be stopped first."""
