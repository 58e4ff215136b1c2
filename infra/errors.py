"""Errors of the local infrastructure launchers.

    InfraError
    ├── PrerequisiteMissing  a system tool (java 17+, mvn) is absent: one line says which
    ├── FetchFailed          Maven could not fetch the broker's jars
    ├── PortInUse            another process holds a port the broker needs
    ├── BrokerStartFailed    the broker process exited or never answered a metadata request
    └── BrokerBusy           the operation needs the broker stopped (wiping its data)
"""


class InfraError(Exception):
    """Root of the launchers' errors; the CLI prints the message as one line."""


class PrerequisiteMissing(InfraError):
    pass


class FetchFailed(InfraError):
    pass


class PortInUse(InfraError):
    pass


class BrokerStartFailed(InfraError):
    pass


class BrokerBusy(InfraError):
    pass
