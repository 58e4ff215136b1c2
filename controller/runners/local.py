"""Harnesses as local processes, each in its own session (process group), output to its log file.

A harness outlives the controller that started it, so a restarted controller
can find it again: next to the log lie `<rollout>.pid` (pid and kernel start
time, so a recycled pid is not mistaken for it) and `<rollout>.exit`, written
by a small `sh` wrapper when the harness ends, which is how a controller that
is not the parent learns the exit code.

With `preload` (modules), Python harnesses start as forks of a zygote that
imported those modules once (zygote.py): the same program, argv and
environment, without paying its imports per rollout (the openai SDK is about
0.6 s of CPU, litellm several seconds).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

from controller.errors import LaunchError
from controller.runners.base import Exit, ProcessSpec
from infra.processes import running_pid, stop_group_async, write_pid_file

_WRAPPER = ('f=$1; shift; "$@"; code=$?; printf %s "$code" > "$f.tmp" && mv "$f.tmp" "$f"; exit $code')
_POLL_S = 0.2
_ZYGOTE = Path(__file__).with_name("zygote.py")


def _python_program(argv: list[str], executable: str) -> bool:
    """`python SCRIPT ...`, `python -m MODULE ...` or `python -c CODE ...`: what a zygote can run."""
    if not Path(executable).name.startswith("python") or len(argv) < 2:
        return False
    return (argv[1] in ("-c", "-m") and len(argv) > 2) or not argv[1].startswith("-")


class _Zygote:
    """One interpreter with the modules imported; forks a child per request (requests one at a time)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self._lock = asyncio.Lock()

    @classmethod
    async def start(cls, interpreter: str, modules: list[str], env: dict[str, str]) -> _Zygote:
        process = await asyncio.create_subprocess_exec(
            interpreter, "-c", _ZYGOTE.read_text(), *modules, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env=env)
        zygote = cls(process)
        reply = await zygote._reply()
        if not reply.get("ready"):
            await zygote.close()
            raise LaunchError(f"preload {' '.join(modules)} with {interpreter}: {reply.get('error', 'no zygote')}")
        return zygote

    async def _reply(self) -> dict[str, object]:
        assert self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            return {"error": f"the zygote exited with {await self.process.wait()} (see the controller's stderr)"}
        reply: dict[str, object] = json.loads(line)
        return reply

    async def fork(self, request: dict[str, object]) -> int:
        assert self.process.stdin is not None
        async with self._lock:
            try:
                self.process.stdin.write(json.dumps(request).encode() + b"\n")
                await self.process.stdin.drain()
            except (OSError, ConnectionError) as exc:  # it died between two rollouts: the next start replaces it
                raise LaunchError(f"the zygote is gone: {exc}") from exc
            reply = await self._reply()
        pid = reply.get("pid")
        if not isinstance(pid, int):
            raise LaunchError(f"the zygote could not fork: {reply.get('error')}")
        return pid

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # it exits at end of input; its children live on
        await self.process.wait()


class LocalRunner:
    def __init__(self, grace_s: float = 5.0, preload: list[str] | None = None) -> None:
        self.grace_s = grace_s
        self.preload = preload or []
        self._children: dict[str, asyncio.subprocess.Process] = {}
        self._cancelled: set[str] = set()
        self._zygotes: dict[str, _Zygote] = {}

    @staticmethod
    def _files(spec: ProcessSpec) -> tuple[Path, Path]:
        """Its pid and exit files, absolute: the wrapper that writes the exit file runs in the harness's workdir."""
        folder = spec.log_path.absolute().parent  # rollout ids have dots: no with_suffix
        return folder / f"{spec.rollout_id}.pid", folder / f"{spec.rollout_id}.exit"

    async def start(self, spec: ProcessSpec) -> None:
        if not spec.argv:
            raise LaunchError(f"{spec.rollout_id}: no harness command")
        executable = shutil.which(spec.argv[0], path=spec.env.get("PATH", os.defpath))
        if executable is None:
            raise LaunchError(f"{spec.argv[0]}: command not found (or not executable)")
        if spec.workdir is not None and not spec.workdir.is_dir():
            raise LaunchError(f"harness.workdir {spec.workdir} is not a directory")
        pid_file, exit_file = self._files(spec)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        exit_file.unlink(missing_ok=True)
        if spec.setup:
            await self._setup(spec)
        if self.preload and _python_program(spec.argv, executable):
            write_pid_file(pid_file, await self._fork(spec, executable, exit_file))
            return
        try:
            with spec.log_path.open("ab") as log:
                process = await asyncio.create_subprocess_exec(
                    "sh", "-c", _WRAPPER, "tether-harness", str(exit_file), *spec.argv,
                    stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                    env=spec.env, cwd=spec.workdir.absolute() if spec.workdir else None, start_new_session=True)
        except OSError as exc:
            raise LaunchError(f"{spec.argv[0]}: cannot start: {exc}") from exc
        self._children[spec.rollout_id] = process
        write_pid_file(pid_file, process.pid)

    async def _setup(self, spec: ProcessSpec) -> None:
        """harness.setup, to its end, its output in the log: a failure is a launch that failed."""
        assert spec.setup
        try:
            with spec.log_path.open("ab") as log:
                process = await asyncio.create_subprocess_exec(
                    *spec.setup, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                    env=spec.env, cwd=spec.workdir.absolute() if spec.workdir else None)
                code = await process.wait()
        except OSError as exc:
            raise LaunchError(f"harness.setup {spec.setup[0]}: cannot start: {exc}") from exc
        if code != 0:
            raise LaunchError(f"harness.setup exited with {code} (its output is in {spec.log_path})")

    async def _fork(self, spec: ProcessSpec, interpreter: str, exit_file: Path) -> int:
        zygote = self._zygotes.get(interpreter)
        if zygote is None or zygote.process.returncode is not None:
            zygote = self._zygotes[interpreter] = await _Zygote.start(interpreter, self.preload, spec.env)
        # the zygote's working directory is the controller's, not the harness's: every path absolute
        return await zygote.fork({"argv": spec.argv[1:], "env": spec.env, "log": str(spec.log_path.absolute()),
                                  "exit": str(exit_file),
                                  "cwd": str(spec.workdir.absolute()) if spec.workdir else None})

    def _running(self, spec: ProcessSpec) -> bool:
        """Its process exists, a zombie included: the exit file may not be written yet."""
        return running_pid(self._files(spec)[0]) is not None

    async def attach(self, spec: ProcessSpec) -> bool:
        return self._running(spec) or self._files(spec)[1].exists()

    async def _exit_code(self, spec: ProcessSpec) -> int | None:
        child = self._children.get(spec.rollout_id)
        if child is not None:
            return await child.wait()
        while self._running(spec):  # noqa: ASYNC110  # not our child: nothing to wait on but polling
            await asyncio.sleep(_POLL_S)
        try:
            return int(self._files(spec)[1].read_text())
        except (OSError, ValueError):
            return None

    async def wait(self, spec: ProcessSpec, timeout_s: float) -> Exit:
        try:
            try:
                code = await asyncio.wait_for(self._exit_code(spec), max(timeout_s, 0.0))
            except TimeoutError:
                if spec.rollout_id in self._cancelled:
                    return Exit("cancelled", None, "cancelled by the controller")
                await self._stop(spec)
                return Exit("timeout", None, f"still running after {timeout_s:.1f} s: stopped")
            if spec.rollout_id in self._cancelled:
                return Exit("cancelled", code, "cancelled by the controller")
            if code is None:
                return Exit("lost", None, "the harness ended while no controller watched, leaving no exit code")
            return Exit("exited", code)
        finally:
            self._children.pop(spec.rollout_id, None)

    async def _stop(self, spec: ProcessSpec) -> None:
        """TERM to the whole group, KILL after the grace period; reaps the child if it is ours."""
        pgid = running_pid(self._files(spec)[0])  # the harness leads its own session: pid = group id
        if pgid is None:
            return
        await stop_group_async(pgid, self.grace_s)
        child = self._children.get(spec.rollout_id)
        if child is not None:
            await child.wait()

    async def cancel(self, spec: ProcessSpec) -> None:
        self._cancelled.add(spec.rollout_id)
        await self._stop(spec)

    async def close(self) -> None:
        self._children.clear()
        for zygote in self._zygotes.values():
            await zygote.close()
        self._zygotes.clear()
