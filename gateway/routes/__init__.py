"""The gateway's own routes, one router per concern: rollouts (reward and seal), admin, health and metrics.

The APIs a harness speaks are in `gateway/api/`; what every router shares in `gateway/http/`."""
