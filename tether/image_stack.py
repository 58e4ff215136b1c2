"""The local stack from the images (`make images`): the same services as `tether.stack`, each in a container of
its own, meeting only over the network; what `tether demo --images` runs.

podman runs them on the host's network (their ports are the stack's), the
broker in its own container (`tether-kafka`, its data in a volume of the
run). Every container sees the stack's home folder (models, the run's
folder) at the path it has here and works in this directory, so the paths
the services are given mean the same inside. The images run as their own
user (uid 10001): where this runs as root, the run's folder is made theirs;
rootless podman maps this user onto theirs instead. Each container's output
is written to the run's logs folder, as the process stack's is.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from infra.images.build import limits, podman
from infra.images.roles import BY_NAME, STATE_DIR, USER_ID
from infra.kafka.launcher import KafkaBroker
from infra.kafka.settings import BrokerSettings
from schemas.admin import ensure_topics
from tether.stack import Service, Stack, StackError, StackSettings

#: which image runs each of the stack's services
IMAGE_OF = {"engine": "trainer", "gateway": "gateway", "processors": "processors", "trainer": "trainer",
            "controller": "agents", "kafka": "kafka"}
_STOP_GRACE_S = 30


class ImageStack(Stack):
    """`Stack` with each service, and the broker, in its own container (`tag`: the images' tag)."""

    def __init__(self, settings: StackSettings, tag: str, mounts: Sequence[Path] = ()) -> None:
        # the broker in its container: one plaintext node on this machine's ports, its data in the run's volume;
        # none of this machine's broker (its recorded shape, its security) is read
        host = BrokerSettings()
        super().__init__(settings, KafkaBroker(BrokerSettings(
            brokers=1, security="plaintext", host="127.0.0.1", port=host.port, controller_port=host.controller_port,
            heap=host.heap, state_dir=settings.run_dir / "kafka-client")))
        if settings.gateway_replicas != 1:
            raise StackError("the stack from images runs one gateway (replicas behind HAProxy: the process stack)")
        self.tag = tag
        self.tool = podman()
        #: folders every container sees at their path here, read-only (the home is writable)
        self.mounts = [p.resolve() for p in mounts]

    def container(self, name: str) -> str:
        return f"tether-{self.settings.run_id}-{name}"

    # -- the broker ----------------------------------------------------------------------------------------------

    def start_broker(self) -> None:
        """The broker's container, healthy and its topics made; kept if it runs."""
        if self.pid("kafka") is None:
            b = self.broker.settings
            self._run("kafka", ["tether", "kafka", "serve"], {
                "TETHER_KAFKA_PORT": str(b.port), "TETHER_KAFKA_CONTROLLER_PORT": str(b.controller_port),
                "TETHER_KAFKA_HEAP": b.heap, "TETHER_KAFKA_STATE_DIR": f"{STATE_DIR}/kafka"},
                volume=f"{self.container('kafka')}:{STATE_DIR}")  # its data in the run's volume, not the host's
        self._await("kafka", lambda: self.broker.probe(timeout_s=2) is not None, self.settings.start_timeout_s)
        import asyncio

        asyncio.run(ensure_topics(self.broker.client_settings()))

    # -- the services --------------------------------------------------------------------------------------------

    def up(self, say: Callable[[str], None] = lambda _: None) -> None:
        """The broker, then every service in order, each healthy before the next."""
        self.pids.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._record()
        if not (self.settings.model / "tokenizer.json").exists():
            raise StackError(f"no model at {self.settings.model}")
        if self.settings.with_trainer:
            self._write_trainer_config()
        self._give_run_folder()
        self.start_broker()
        say(f"Kafka: container {self.container('kafka')} on {self.broker.bootstrap}")
        for service in self.services():
            if self.pid(service.name) is None:
                self._start(service)
            say(f"{service.name}: container {self.container(service.name)}")

    def services(self) -> list[Service]:
        """The process stack's, but the processors sink no analytics: their image holds no embedded ClickHouse
        (a server's DSN would do; the demo reads its figures from the topics)."""
        return [replace(s, env={**s.env, "TETHER_PROCESSOR_CLICKHOUSE_DSN": ""}) if s.name == "processors" else s
                for s in super().services()]

    def _start(self, service: Service) -> None:
        health = ["--health-cmd", f"python -m infra.health --url http://127.0.0.1:{self.settings.engine_port}/health"]
        self._run(service.name, command_of(service), service.env, options=health if service.name == "engine" else ())
        self._await(service.name, service.health, self.settings.start_timeout_s, settle_s=3.0)

    def run_controller(self, command: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        """`tether controller run` in its container (its harnesses run beside it, by its local runner), attached:
        the process returned is podman's, which passes signals on (SIGINT: the controller cancels what runs)."""
        subprocess.run([self.tool, "rm", "--force", self.container("controller")], capture_output=True)
        with log.open("ab") as out:
            return subprocess.Popen(self._args("controller", command, env), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def pid(self, name: str) -> int | None:
        """The container's main process as the host sees it, while it runs."""
        found = subprocess.run([self.tool, "inspect", "--format", "{{.State.Running}} {{.State.Pid}}",
                                self.container(name)], capture_output=True, text=True)
        running, _, pid = found.stdout.strip().partition(" ")
        return int(pid) if found.returncode == 0 and running == "true" and pid.isdigit() and int(pid) else None

    def exit_code(self, name: str) -> int | None:
        found = subprocess.run([self.tool, "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}",
                                self.container(name)], capture_output=True, text=True)
        running, _, code = found.stdout.strip().partition(" ")
        return int(code) if found.returncode == 0 and running == "false" else None

    def down(self, say: Callable[[str], None] = lambda _: None, keep_kafka: bool = False) -> None:
        """Stop every container, last started first (SIGTERM, then SIGKILL after the grace); the broker last."""
        names = ["controller", *(s.name for s in reversed(self.services()))] + ([] if keep_kafka else ["kafka"])
        for name in names:
            stopped = subprocess.run([self.tool, "stop", "--time", str(_STOP_GRACE_S), self.container(name)],
                                     capture_output=True, text=True)
            subprocess.run([self.tool, "rm", "--force", self.container(name)], capture_output=True)
            if stopped.returncode == 0:
                say(f"{name}: stopped")
        if not keep_kafka:
            subprocess.run([self.tool, "volume", "rm", "--force", self.container("kafka")], capture_output=True)
        (self.pids / "stack.json").unlink(missing_ok=True)

    # -- podman ----------------------------------------------------------------------------------------------------

    def _run(self, name: str, command: Sequence[str], env: dict[str, str], volume: str | None = None,
             options: Sequence[str] = ()) -> None:
        """The service's container, detached, its output in the run's logs folder; `options`: podman run's (the
        engine, from the trainer's image, is checked by its /health instead of the trainer's beat)."""
        subprocess.run([self.tool, "rm", "--force", self.container(name)], capture_output=True)
        log = ["--log-driver", "k8s-file", "--log-opt", f"path={(self.logs / f'{name}.log').resolve()}", *options]
        args = self._args(name, command, env, volume)
        started = subprocess.run([*args[:2], "--detach", *log, *args[2:]], capture_output=True, text=True,
                                 timeout=120)
        if started.returncode != 0:
            raise StackError(f"the {name}'s container did not start: {started.stderr.strip()[-2000:]}")

    def _args(self, name: str, command: Sequence[str], env: dict[str, str], volume: str | None = None) -> list[str]:
        """`podman run` of `name`'s image with `command`: the host's network, the home folder and `mounts` at
        their paths, this directory as the working one, `env` (nothing else of this environment)."""
        home = self.settings.home.resolve()
        args = [self.tool, "run", "--name", self.container(name), "--network", "host", *limits(),
                "--workdir", str(Path.cwd()), "--volume", f"{home}:{home}",
                *(a for p in self.mounts for a in ("--volume", f"{p}:{p}:ro")),
                *(("--volume", volume) if volume else ()), *self._user()]
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        return [*args, f"{BY_NAME[IMAGE_OF[name]].image}:{self.tag}", *command]

    def _user(self) -> list[str]:
        """Rootless: this user is the images' user inside. As root: the images' own user (the run's folder is
        theirs, `_give_run_folder`)."""
        return [] if os.geteuid() == 0 else ["--userns", f"keep-id:uid={USER_ID},gid={USER_ID}"]

    def _give_run_folder(self) -> None:
        """As root, the folders the services write (the run's, the health beats) become the images' user's, and
        the model they read (its weights may be written readable by their owner alone)."""
        if os.geteuid() != 0:
            return
        for folder in (self.settings.run_dir, self.settings.home / "health", self.settings.model):
            folder.mkdir(parents=True, exist_ok=True)
            for path in (folder, *folder.rglob("*")):
                os.chown(path, USER_ID, USER_ID, follow_symlinks=False)

    def _await(self, name: str, healthy: Callable[[], bool], timeout_s: float, settle_s: float = 0.0) -> None:
        deadline, settle = time.monotonic() + timeout_s, time.monotonic() + settle_s
        while time.monotonic() < deadline:
            if self.pid(name) is None:
                raise StackError(f"the {name}'s container exited with {self.exit_code(name)} while starting; its "
                                 f"output: {self.logs / f'{name}.log'}: {_tail(self.logs / f'{name}.log')}")
            if healthy() and time.monotonic() >= settle:
                return
            time.sleep(0.5)
        raise StackError(f"the {name}'s container was not healthy within {timeout_s:.0f} s; its output: "
                         f"{self.logs / f'{name}.log'}")


def command_of(service: Service) -> list[str]:
    """The service's command as its image runs it: `tether ...` (the process stack runs `python -m tether.cli`)."""
    argv = service.argv
    return ["tether", *argv[3:]] if argv[1:3] == ["-m", "tether.cli"] else list(argv)


def _tail(log: Path, lines: int = 5) -> str:
    """The last lines of a container's log (k8s-file: time, stream, tag, then the line)."""
    try:
        text = log.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return "(no output)"
    return " | ".join(line.split(" ", 3)[-1] for line in text)


def missing_images(tag: str) -> list[str]:
    """The stack's images not built here (`make images`)."""
    tool = podman()
    return [f"{BY_NAME[r].image}:{tag}" for r in sorted(set(IMAGE_OF.values()))
            if subprocess.run([tool, "image", "exists", f"{BY_NAME[r].image}:{tag}"]).returncode != 0]
