"""Tether's images: each role installs what it runs and nothing of the others, its health check tells, and the
gateway's image, built here with podman, answers a real openai-SDK call against a broker on the host.

The image test needs podman and mmdebstrap (`make test` installs them where it may: root with apt-get); where
they are missing it is skipped, saying which.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra.health import beat, beat_file, check_beat, check_tcp, check_url, main
from infra.images.build import CONTAINERFILE, ImageError, build, limits
from infra.images.roles import BY_NAME, ROLES, STATE_DIR, USER_ID, Role
from infra.kafka.settings import BrokerSettings
from infra.processes import free_port
from tests.conftest import ADMIN_KEY, SECRET, RunningEngine

ROOT = Path(__file__).parent.parent
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
#: the modules each extra brings that no other part needs: a role without the extra must not import them
EXTRA_MODULES = {"processors": ("faust", "clickhouse_connect"), "controller": ("kubernetes",),
                 "analytics": ("chdb", "clickhouse_connect", "matplotlib", "transformers"),
                 "trainer": ("torch", "transformers", "verl", "datasets", "ray", "peft", "matplotlib", "numpy",
                             "omegaconf", "safetensors", "tensordict"),
                 "demo": ("openai",), "swe": ("pytest",)}

IMPORTS = """
import importlib, pkgutil, sys
blocked, packages = sys.argv[1].split(","), sys.argv[2].split(",")
for name in blocked:
    sys.modules[name] = None  # `import name` now fails, as where it is not installed
failed = []
for module in ["tether.cli.main", *packages]:
    importlib.import_module(module)
for package in packages:
    for found in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        try:
            importlib.import_module(found.name)
        except ImportError as exc:
            failed.append(f"{found.name}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_extra_a_role_names_exists_and_the_module_table_covers_them() -> None:
    assert set(EXTRA_MODULES) == set(EXTRAS) - {"all", "test"}
    assert EXTRAS["all"] == [f"tether[{','.join(sorted(EXTRA_MODULES, key=list(EXTRAS).index))}]"]
    for role in ROLES:
        assert set(role.extras) <= set(EXTRAS), role


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_each_role_imports_with_none_of_the_other_roles_packages(role: Role) -> None:
    """What an image of the role lacks is blocked; everything the role runs still imports (its CLI too)."""
    kept = {m for extra in role.extras for m in EXTRA_MODULES.get(extra, ())}
    blocked = sorted({m for modules in EXTRA_MODULES.values() for m in modules} - kept)
    result = subprocess.run([sys.executable, "-c", IMPORTS, ",".join(blocked), ",".join(role.packages)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, f"{role.name} needs what its image lacks:\n{result.stdout}{result.stderr[-2000:]}"


def test_the_containerfile_has_a_target_per_role_installing_its_extras_and_running_its_command() -> None:
    text = CONTAINERFILE.read_text()
    for role in ROLES:
        stage = "gateway" if role.name == "kafka" else role.name  # the broker's image: the core, and Java
        install = text.split(f"FROM install AS install-{stage}\n", 1)[1].split("\nFROM ", 1)[0]
        assert f'RUN /build/install.sh deps "{",".join(role.extras)}"' in install, role.name
        assert install.index("install.sh deps") < install.index("COPY dist/") < install.index("install.sh wheel")
        target = text.split(f"FROM python AS {role.name}\n", 1)[1].split("\nFROM ", 1)[0]
        assert f"COPY --from=install-{stage} /opt/tether /opt/tether" in target
        assert f"USER {USER_ID}:{USER_ID}" in target and "HEALTHCHECK" in target and "infra.health" in target
        assert f"CMD {json.dumps(list(role.command))}" in target.replace('", "', '", "')
        if role.port is not None:
            assert f"EXPOSE {role.port}" in target
        if '"--beat"' in target:  # checked by the file its command beats (`tether <role> run`)
            beats = "controller" if role.name == "agents" else role.name
            assert f'"--beat", "{beat_file(beats)}"' in target, role.name
    assert text.count('"--beat"') == 4  # processors, controller, agents, trainer
    assert f"ARG KAFKA_VERSION={BrokerSettings().version}\n" in text  # the default, for builds elsewhere
    uv = re.search(r"^UV\s*:=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert uv is not None and f"ARG UV={uv.group(1)}\n" in text  # the same uv as `make setup`
    assert f"--uid {USER_ID} --gid {USER_ID} --home-dir {STATE_DIR}" in text and f"WORKDIR {STATE_DIR}\n" in text


# -- the health check -------------------------------------------------------------------------------------------


def test_a_beat_is_healthy_while_fresh_and_says_why_not_otherwise(tmp_path: Path) -> None:
    path = tmp_path / beat_file("processors")
    assert "does not exist" in (check_beat(path) or "")
    beat(path)
    assert check_beat(path) is None
    assert "last beaten" in (check_beat(path, max_age_s=30, now=time.time() + 31) or "")
    path.write_text("not a time")
    assert "cannot be read" in (check_beat(path) or "")
    beat(path)
    assert main(["--beat", str(path)]) == 0
    assert main(["--beat", str(path), "--max-age-s", "-1"]) == 1


class _Status(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_url_is_healthy_when_it_answers_200() -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Status)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        assert check_url(f"{base}/health") is None
        assert main(["--url", f"{base}/health"]) == 0
        assert "503" in (check_url(f"{base}/other") or "")
    finally:
        server.shutdown()
    assert "did not answer" in (check_url(f"http://127.0.0.1:{free_port()}/health", timeout_s=2) or "")


def test_a_port_is_healthy_when_it_takes_a_connection() -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Status)
    try:
        assert main(["--tcp", f"127.0.0.1:{server.server_port}"]) == 0
    finally:
        server.server_close()
    assert "took no connection" in (check_tcp(f"127.0.0.1:{free_port()}", timeout_s=2) or "")
    assert "took no connection" in (check_tcp("no-port-here", timeout_s=2) or "")


# -- the gateway's image, built and run ------------------------------------------------------------------------


def _missing() -> str | None:
    """What this machine lacks to build and run the images, or None."""
    for tool in ("podman", "mmdebstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: apt-get install podman runc mmdebstrap uidmap)"
    info = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return f"podman is installed but does not work here: {info.stderr.strip()[-300:]}"
    return None


def test_without_podman_the_build_and_the_image_tests_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where podman is absent (`make test` installs it only as root with apt-get), the image tests skip with the
    package names and `make images` fails in one line naming them, not with a traceback."""
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "podman is not installed" in (_missing() or "") and "apt-get install podman" in (_missing() or "")
    with pytest.raises(ImageError, match=r"podman is not installed.*apt-get install podman runc mmdebstrap"):
        build([BY_NAME["gateway"]], tag="never")


@pytest.fixture(scope="module")
def gateway_image() -> str:
    missing = _missing()
    if missing is not None:
        pytest.skip(f"the images cannot be built here: {missing}")
    tag = "test"
    try:
        build([BY_NAME["gateway"]], tag=tag)
    except ImageError as exc:
        pytest.fail(f"the gateway's image did not build: {exc}")
    return f"tether-gateway:{tag}"


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"tether-test-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["podman", "rm", "--force", "--time", "0", name], capture_output=True, timeout=60)


def test_the_gateway_image_answers_an_openai_call_recorded_on_the_hosts_broker(
        gateway_image: str, container_name: str, bus: object, fake_vllm: RunningEngine, tiny_model: Path,
        run_id: str) -> None:
    """Settings from the environment only, as the manifests pass them; the model folder mounted read-only; the
    container meets the broker and the engine over the network. Then its health check passes, and SIGTERM drains
    it to a clean exit."""
    from openai import OpenAI

    from schemas import topics
    from schemas.events import GatewayLeft, ModelCall
    from schemas.rollout_token import mint
    from schemas.settings import BusSettings
    from stream_processors.replay import read_run_events

    assert isinstance(bus, BusSettings)
    port = free_port()
    env = {"TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers, "TETHER_GATEWAY_SECRET": SECRET,
           "TETHER_GATEWAY_ADMIN_KEY": ADMIN_KEY, "TETHER_GATEWAY_ENGINES": json.dumps([fake_vllm.url]),
           "TETHER_GATEWAY_TOKENIZER": "/models/tiny", "TETHER_GATEWAY_PORT": str(port),
           "TETHER_GATEWAY_RUN_ID": run_id, "TETHER_GATEWAY_ENGINE_KIND": "vllm"}
    args = ["podman", "run", "--detach", "--name", container_name, "--network", "host", *limits(),
            "--volume", f"{tiny_model}:/models/tiny:ro"]
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    subprocess.run([*args, gateway_image], check=True, capture_output=True, timeout=60)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        state = subprocess.run(["podman", "inspect", "--format", "{{.State.Status}}", container_name],
                               capture_output=True, text=True).stdout.strip()
        printed = subprocess.run(["podman", "logs", container_name], capture_output=True, text=True).stderr
        assert state == "running" and time.monotonic() < deadline, f"the gateway did not start ({state}):\n{printed}"
        time.sleep(0.5)

    rollout_id = f"{run_id}-r0"
    httpx.post(f"{url}/admin/rollouts", json={"rollout_id": rollout_id, "run_id": run_id},
               headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10).raise_for_status()
    client = OpenAI(base_url=f"{url}/v1", api_key=mint(rollout_id, SECRET), timeout=60)
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Look x up."}],
                                            tools=[{"type": "function", "function": {
                                                "name": "lookup", "parameters": {"type": "object"}}}])
    (called,) = answer.choices[0].message.tool_calls or []
    assert called.type == "function" and called.function.name == "lookup"

    calls = [e for e in asyncio.run(read_run_events(bus, run_id)) if isinstance(e, ModelCall)]
    assert [c.rollout_id for c in calls] == [rollout_id]
    assert calls[0].response_token_ids and calls[0].prompt_token_ids

    health = subprocess.run(["podman", "healthcheck", "run", container_name], capture_output=True, text=True,
                            timeout=60)
    assert health.returncode == 0, health.stdout + health.stderr
    user = subprocess.run(["podman", "exec", container_name, "id", "-u"], capture_output=True, text=True, timeout=30)
    assert user.stdout.strip() == str(USER_ID)

    # SIGTERM (through tini): uvicorn stops taking calls, the app's shutdown leaves the run, and the process
    # ends by the signal it was sent (143), well before podman would kill it (137)
    stopped = subprocess.run(["podman", "stop", "--time", "60", container_name], capture_output=True, text=True,
                             timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    exit_code = subprocess.run(["podman", "inspect", "--format", "{{.State.ExitCode}}", container_name],
                               capture_output=True, text=True).stdout.strip()
    logs = subprocess.run(["podman", "logs", container_name], capture_output=True, text=True)
    assert exit_code in ("0", "143"), f"exit {exit_code}:\n{logs.stdout}{logs.stderr}"
    control = asyncio.run(read_run_events(bus, run_id, read=(topics.CONTROL,)))
    assert [e.reason for e in control if isinstance(e, GatewayLeft)] == ["shut down"]
