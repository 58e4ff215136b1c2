"""What a harness gets of the controller's environment: never the controller's own secrets.

The controller holds the secret that mints every rollout's token, the
gateway's admin key and the broker's credentials (`TETHER_CONTROLLER_*`,
`TETHER_GATEWAY_*`, `TETHER_BUS_*`): a harness that read them could speak as
any rollout, seal or register rollouts, or write the topics. Unsandboxed, a
harness gets the rest of the environment, as a process started by hand would;
in the sandbox it gets only what a program needs to run (`PASSED`) and what the
run file names (`sandbox.pass_env`). Either way the rollout's own variables
(its token, the gateway's URLs, `harness.env`) come on top.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: the controller's own: never passed to a harness, whatever the run file says
SECRET_PREFIXES = ("TETHER_CONTROLLER_", "TETHER_GATEWAY_", "TETHER_BUS_")
#: what a sandboxed harness gets of the controller's environment without asking
PASSED = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM"})


def unsandboxed(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if not k.startswith(SECRET_PREFIXES)}


def sandboxed(environ: Mapping[str, str], passed: Iterable[str]) -> dict[str, str]:
    wanted = PASSED | set(passed)
    return {k: v for k, v in environ.items()
            if (k in wanted or k.startswith("LC_")) and not k.startswith(SECRET_PREFIXES)}
