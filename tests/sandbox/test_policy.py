"""The policy, pure: the precedence of its mounts (a property test), the gateway's address inside, and what the
controller gives a sandboxed harness of its environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller import harness_env
from controller.config import Harness, Sandbox
from controller.main import process_specs
from controller.runners.base import Spec
from infra.sandbox.errors import PolicyError
from infra.sandbox.policy import Layout, Limits, Policy, gateway_of, inside_url, plan, visibility


def test_the_controller_gives_a_sandboxed_harness_none_of_its_secrets(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TETHER_CONTROLLER_GATEWAY_SECRET", "TETHER_GATEWAY_ADMIN_KEY", "TETHER_BUS_PASSWORD", "AWS_TOKEN"):
        monkeypatch.setenv(name, "secret")
    base = Spec(rollout_id="r.t.r0.a0", run_id="r", task_id="t", attempt=0, env={"OPENAI_API_KEY": "mine"},
                log_path=tmp_path / "r.log")
    harness = Harness(command=["agent", "{rollout_id}"], workdir=tmp_path, setup=["mkdir", "work/{rollout_id}"])
    spec = process_specs(harness, Sandbox(workdir="work/{rollout_id}"), "http://127.0.0.1:8000")(
        base, lambda obj: json.loads(json.dumps(obj).replace("{rollout_id}", base.rollout_id)))
    assert spec.env["OPENAI_API_KEY"] == "mine" and not {k for k in spec.env if "secret" in spec.env[k]}
    assert spec.setup == ["mkdir", "work/r.t.r0.a0"] and spec.argv[-2:] == ["agent", "r.t.r0.a0"]
    policy = Policy.model_validate_json(spec.argv[3])
    assert policy.workdir == str(tmp_path / "work" / "r.t.r0.a0")
    loose = process_specs(harness, Sandbox(enabled=False))(base, lambda obj: obj)
    assert "AWS_TOKEN" in loose.env and not {k for k in loose.env if k.startswith(harness_env.SECRET_PREFIXES)}


def test_a_gateway_the_sandbox_cannot_stand_for_is_refused() -> None:
    assert gateway_of("http://gateway.tether:8000").name == "gateway.tether"
    assert gateway_of("https://[::1]/v1").listen == ("::1",) and gateway_of("https://[::1]/v1").port == 443
    for url in ("http://10.0.0.5:8000", "ftp://127.0.0.1", "http://:80"):
        with pytest.raises(PolicyError):
            gateway_of(url)


# -- the plan, held to its rules: writable over hidden over read-only, and nothing unnamed -------------------

segment = st.sampled_from(["a", "b", "c", "work", "tasks"])
paths = st.lists(segment, min_size=1, max_size=4).map(lambda parts: "/data/" + "/".join(parts))


@given(read_only=st.lists(paths, max_size=4), hide=st.lists(paths, max_size=3),
       writable=st.lists(paths, max_size=3), workdir=paths, probe=paths)
def test_a_path_is_seen_as_the_policy_says(read_only: list[str], hide: list[str], writable: list[str],
                                          workdir: str, probe: str) -> None:
    policy = Policy(workdir=workdir, read_only=read_only, hide=hide, writable=writable, gateway="http://127.0.0.1:1",
                    limits=Limits())

    def under(p: str, roots: list[str]) -> bool:
        return any(p == r or p.startswith(r + "/") for r in roots)

    layout = Layout(system=(("/usr", None), ("/bin", "usr/bin")), interpreter=("/opt/python",))
    mine = [workdir, *writable]
    try:
        mounts = plan(policy, layout)
    except PolicyError:  # refused only where a writable folder holds another, or a path the agent must only read
        assert any(under(a, [b]) for a in mine for b in mine if a is not b) or \
            any(under(p, mine) for p in [*read_only, *hide])
        return
    seen = visibility(mounts, probe)
    if under(probe, [workdir, *writable]):
        assert seen == "writable"
    elif under(probe, hide):
        assert seen == "empty"
    elif under(probe, read_only):
        assert seen == "read-only"
    else:
        assert seen == "absent"
    assert visibility(mounts, "/opt/python/lib") == "read-only" and visibility(mounts, "/root") == "absent"


def test_a_gateway_on_a_privileged_port_is_served_inside_on_another(site: Path, tmp_path: Path) -> None:
    """An unprivileged user cannot listen on port 80: the harness is told the gateway's URL with the port the
    sandbox serves it on, and its calls reach the real one."""
    assert inside_url("http://gateway.tether/v1") == "http://gateway.tether:10080/v1"
    assert inside_url("https://u@[::1]:443/v1") == "https://u@[::1]:10443/v1"
    assert inside_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    base = Spec(rollout_id="r", run_id="r", task_id="t", attempt=0, log_path=tmp_path / "log",
                env={"OPENAI_BASE_URL": "http://gateway.tether/v1", "TETHER_REWARD_URL": "http://gateway.tether/r"})
    spec = process_specs(Harness(command=["a"], workdir=tmp_path), Sandbox(workdir="."), "http://gateway.tether")(
        base, lambda obj: obj)
    assert spec.env["OPENAI_BASE_URL"] == "http://gateway.tether:10080/v1"
    assert spec.env["TETHER_REWARD_URL"] == "http://gateway.tether:10080/r"
