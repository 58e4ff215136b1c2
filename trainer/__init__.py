"""The trainer: task groups from tether.samples become weight versions, through the update handshake."""
