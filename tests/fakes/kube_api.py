"""FakeKubeAPI: a fake Kubernetes API server that runs each Job's container command as a local process.

It speaks the real REST API (paths, JSON objects, `Status` errors, chunked
watch streams of `{"type", "object"}` lines) for exactly the calls the
Kubernetes runner makes: create/get/list/watch/delete batch/v1 Jobs, list
pods, read a pod's log. Images, scheduling and the rest of Kubernetes are not
modelled: a Job's first container runs as `command + args` with its `env`,
its pod succeeds or fails with the process's exit code, `activeDeadlineSeconds`
kills it (`DeadlineExceeded`), and a command that cannot execute gives a
terminated container with reason `StartError`, as a kubelet reports it.

    python -m tests.fakes.kube_api --port 8443
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

_versions = itertools.count(1)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


class Job:
    def __init__(self, manifest: dict[str, Any], namespace: str, logs: Path) -> None:
        meta = manifest.setdefault("metadata", {})
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now(),
                    resourceVersion=str(next(_versions)))
        manifest.setdefault("apiVersion", "batch/v1")
        manifest.setdefault("kind", "Job")
        manifest["status"] = {"active": 1, "startTime": _now()}
        self.manifest = manifest
        self.name: str = meta["name"]
        self.pod_name = f"{self.name}-{uuid.uuid4().hex[:5]}"
        self.log = logs / f"{self.pod_name}.log"
        self.pod_phase, self.terminated = "Pending", None  # type: tuple[str, dict[str, Any] | None]
        self.process: asyncio.subprocess.Process | None = None

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.manifest["metadata"].get("labels") or {})

    def finish(self, condition: str, reason: str, code: int | None, container_reason: str) -> None:
        status = self.manifest["status"]
        status.pop("active", None)
        status["succeeded" if condition == "Complete" else "failed"] = 1
        status["completionTime"] = _now()
        status["conditions"] = [{"type": condition, "status": "True", "reason": reason,
                                 "lastProbeTime": _now(), "lastTransitionTime": _now()}]
        self.pod_phase = "Succeeded" if condition == "Complete" else "Failed"
        self.terminated = {"exitCode": 128 if code is None else code, "reason": container_reason,
                           "startedAt": status["startTime"], "finishedAt": _now()}
        self.manifest["metadata"]["resourceVersion"] = str(next(_versions))

    def pod(self) -> dict[str, Any]:
        template = self.manifest["spec"]["template"]
        container = template["spec"]["containers"][0]
        state = {"terminated": self.terminated} if self.terminated else {"running": {"startedAt": _now()}}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": self.pod_name, "namespace": self.manifest["metadata"]["namespace"],
                             "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, self.pod_name)),
                             "labels": {**(template.get("metadata", {}).get("labels") or {}),
                                        "job-name": self.name, "batch.kubernetes.io/job-name": self.name}},
                "spec": template["spec"],
                "status": {"phase": self.pod_phase, "containerStatuses": [
                    {"name": container["name"], "image": container.get("image", ""), "imageID": "",
                     "ready": self.terminated is None, "restartCount": 0, "state": state}]}}


class FakeKubeAPI:
    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], Job] = {}
        self.watchers: list[tuple[str, str | None, asyncio.Queue[dict[str, Any]]]] = []
        self.logs = Path(tempfile.mkdtemp(prefix="fake-kube-logs-"))

    def app(self) -> web.Application:
        app = web.Application()
        jobs = "/apis/batch/v1/namespaces/{ns}/jobs"
        app.router.add_post(jobs, self.create_job)
        app.router.add_get(jobs, self.list_jobs)
        app.router.add_get(jobs + "/{name}", self.get_job)
        app.router.add_get(jobs + "/{name}/status", self.get_job)
        app.router.add_delete(jobs + "/{name}", self.delete_job)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.list_pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", self.pod_log)
        for probe in ("/healthz", "/health"):
            app.router.add_get(probe, self.health)
        return app

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    def _notify(self, kind: str, job: Job) -> None:
        for namespace, selector, queue in self.watchers:
            if namespace == job.manifest["metadata"]["namespace"] and _matches(job.labels, selector):
                queue.put_nowait({"type": kind, "object": json.loads(json.dumps(job.manifest))})

    async def create_job(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        manifest = await request.json()
        name = (manifest.get("metadata") or {}).get("name")
        if not name:
            return _status(422, "Invalid", "Job.batch is invalid: metadata.name: Required value")
        if (ns, name) in self.jobs:
            return _status(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
        try:
            containers = manifest["spec"]["template"]["spec"]["containers"]
            assert containers and containers[0].get("name")
        except (KeyError, TypeError, AssertionError):
            return _status(422, "Invalid", "Job.batch is invalid: spec.template.spec.containers: Required value")
        job = Job(manifest, ns, self.logs)
        self.jobs[(ns, name)] = job
        self._notify("ADDED", job)
        asyncio.get_running_loop().create_task(self._run(job))
        return web.json_response(job.manifest, status=201)

    async def _run(self, job: Job) -> None:
        container = job.manifest["spec"]["template"]["spec"]["containers"][0]
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        env = {"PATH": os.environ.get("PATH", os.defpath),
               **{e["name"]: str(e.get("value", "")) for e in container.get("env") or []}}
        deadline = job.manifest["spec"].get("activeDeadlineSeconds")
        try:
            with job.log.open("wb") as log:
                job.process = await asyncio.create_subprocess_exec(
                    *argv, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env,
                    cwd=container.get("workingDir"), start_new_session=True)
        except (OSError, IndexError) as exc:
            job.log.write_text(f"failed to start container: {exc}\n")
            job.finish("Failed", "BackoffLimitExceeded", None, "StartError")
            self._notify("MODIFIED", job)
            return
        job.pod_phase = "Running"
        self._notify("MODIFIED", job)
        try:
            code = await asyncio.wait_for(job.process.wait(), deadline)
        except TimeoutError:
            self._kill(job)
            await job.process.wait()
            job.finish("Failed", "DeadlineExceeded", 137, "Error")
        else:
            job.finish(*(("Complete", "Completed") if code == 0 else ("Failed", "BackoffLimitExceeded")),
                       code, "Completed" if code == 0 else "Error")
        if (job.manifest["metadata"]["namespace"], job.name) in self.jobs:
            self._notify("MODIFIED", job)

    @staticmethod
    def _kill(job: Job) -> None:
        if job.process is not None and job.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.process.pid, signal.SIGKILL)

    def _job(self, request: web.Request) -> Job | None:
        return self.jobs.get((request.match_info["ns"], request.match_info["name"]))

    async def get_job(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job is None:
            return _status(404, "NotFound", f'jobs.batch "{request.match_info["name"]}" not found')
        return web.json_response(job.manifest)

    async def list_jobs(self, request: web.Request) -> web.StreamResponse:
        ns, selector = request.match_info["ns"], request.query.get("labelSelector")
        matching = [j for (n, _), j in self.jobs.items() if n == ns and _matches(j.labels, selector)]
        if request.query.get("watch", "").lower() not in ("true", "1"):
            return web.json_response({"kind": "JobList", "apiVersion": "batch/v1",
                                      "metadata": {"resourceVersion": str(next(_versions))},
                                      "items": [j.manifest for j in matching]})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        entry = (ns, selector, queue)
        self.watchers.append(entry)
        for job in matching:  # a new watch starts from the current state
            queue.put_nowait({"type": "ADDED", "object": job.manifest})
        timeout = float(request.query.get("timeoutSeconds", 300))
        try:
            async with asyncio.timeout(timeout):
                while True:
                    await response.write(json.dumps(await queue.get()).encode() + b"\n")
        except (TimeoutError, ConnectionResetError):
            pass
        finally:
            self.watchers.remove(entry)
        return response

    async def delete_job(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job is None:
            return _status(404, "NotFound", f'jobs.batch "{request.match_info["name"]}" not found')
        self._kill(job)
        del self.jobs[(request.match_info["ns"], job.name)]
        self._notify("DELETED", job)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                  "details": {"name": job.name, "group": "batch", "kind": "jobs",
                                              "uid": job.manifest["metadata"]["uid"]}})

    async def list_pods(self, request: web.Request) -> web.Response:
        ns, selector = request.match_info["ns"], request.query.get("labelSelector")
        pods = [j.pod() for (n, _), j in self.jobs.items() if n == ns]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                                  "items": [p for p in pods if _matches(p["metadata"]["labels"], selector)]})

    async def pod_log(self, request: web.Request) -> web.Response:
        for (ns, _), job in self.jobs.items():
            if ns == request.match_info["ns"] and job.pod_name == request.match_info["name"]:
                return web.Response(text=job.log.read_text(errors="replace") if job.log.exists() else "")
        return _status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    args = parser.parse_args()
    api = FakeKubeAPI()
    web.run_app(api.app(), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
