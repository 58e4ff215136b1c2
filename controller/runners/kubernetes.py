"""Harnesses as Kubernetes Jobs, through the official client: one batch/v1 Job per rollout.

Each Job comes from the run's template with the rollout's environment
injected into every container, labels naming run, rollout, task and attempt,
`backoffLimit: 0` (a retry is a new rollout, decided by the controller),
`restartPolicy: Never`, `activeDeadlineSeconds` = the rollout timeout (the API
server enforces it even while no controller runs) and
`ttlSecondsAfterFinished`. One watch per run follows every Job of the run;
the client is synchronous, so its calls run in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import re
import threading
import time
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from controller.config import Kubernetes
from controller.errors import LaunchError
from controller.runners.base import Exit, JobSpec

_NOT_STARTED = {"StartError", "ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "InvalidImageName",
                "CreateContainerError"}
LABELS = ("tether.dev/run-id", "tether.dev/rollout-id", "tether.dev/task-id", "tether.dev/attempt")


def _label(value: str) -> str:
    """A label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends; a hash keeps it unique."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", value).strip("._-")
    if safe == value and len(safe) <= 63:
        return safe
    return f"{safe[:54].rstrip('._-')}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"


def job_name(rollout_id: str) -> str:
    """A DNS-1123 name (lowercase alphanumerics and '-', at most 63), unique per rollout id."""
    safe = re.sub(r"[^a-z0-9-]+", "-", rollout_id.lower()).strip("-")
    return f"tr-{safe[:50].rstrip('-')}-{hashlib.sha256(rollout_id.encode()).hexdigest()[:8]}"


def build_job(spec: JobSpec, namespace: str, timeout_s: float, ttl_s: int) -> dict[str, Any]:
    """The Job for one rollout from its filled template (pure: tested without a cluster)."""
    job = copy.deepcopy(spec.job)
    labels = dict(zip(LABELS, (_label(spec.run_id), _label(spec.rollout_id), _label(spec.task_id),
                               str(spec.attempt)), strict=True))
    meta = job.setdefault("metadata", {})
    meta.update(name=job_name(spec.rollout_id), namespace=namespace)
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    meta["annotations"] = {**(meta.get("annotations") or {}), "tether.dev/rollout-id": spec.rollout_id,
                           "tether.dev/task-id": spec.task_id}
    job_spec = job.setdefault("spec", {})
    job_spec.update(backoffLimit=0, activeDeadlineSeconds=max(1, int(timeout_s + 0.999)),
                    ttlSecondsAfterFinished=ttl_s)
    template = job_spec.setdefault("template", {})
    pod_meta = template.setdefault("metadata", {})
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
    pod = template.setdefault("spec", {})
    pod["restartPolicy"] = "Never"
    for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        kept = [e for e in container.get("env") or [] if e.get("name") not in spec.env]
        container["env"] = kept + [{"name": k, "value": v} for k, v in spec.env.items()]
    return job


class KubernetesRunner:
    def __init__(self, settings: Kubernetes, run_id: str, timeout_s: float, grace_s: float = 5.0) -> None:
        self.settings, self.run_id, self.timeout_s, self.grace_s = settings, run_id, timeout_s, grace_s
        configuration = client.Configuration()
        if settings.host is None:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                config.load_kube_config(config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                                        client_configuration=configuration)
        else:
            configuration.host = settings.host
        self._api = client.ApiClient(configuration)
        self.batch, self.core = client.BatchV1Api(self._api), client.CoreV1Api(self._api)
        self._jobs: dict[str, Any] = {}  # job name → latest V1Job seen (None: deleted)
        self._changed: asyncio.Event | None = None
        self._cancelled: set[str] = set()
        self._next_create = 0.0
        self._create_lock = asyncio.Lock()
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None

    # -- watch ---------------------------------------------------------------------

    def _ensure_watch(self) -> None:
        if self._watcher is not None:
            return
        self._changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._watcher = threading.Thread(target=self._watch, args=(loop,), name="tether-k8s-watch", daemon=True)
        self._watcher.start()

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        selector = f"{LABELS[0]}={_label(self.run_id)}"
        while not self._closing.is_set():
            try:
                for event in watch.Watch().stream(self.batch.list_namespaced_job, self.settings.namespace,
                                                  label_selector=selector, timeout_seconds=5):
                    job = event["object"]
                    seen = None if event["type"] == "DELETED" else job
                    loop.call_soon_threadsafe(self._seen, job.metadata.name, seen)
                    if self._closing.is_set():
                        return
            except (ApiException, HTTPError, OSError, ValueError):
                if self._closing.wait(1.0):
                    return

    def _seen(self, name: str, job: Any) -> None:
        self._jobs[name] = job
        assert self._changed is not None
        self._changed.set()

    # -- the runner interface ------------------------------------------------------

    async def start(self, spec: JobSpec) -> None:
        self._ensure_watch()
        body = build_job(spec, self.settings.namespace, self.timeout_s, self.settings.ttl_s)
        async with self._create_lock:  # the creation rate limit
            delay = self._next_create - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._next_create = time.monotonic() + 1.0 / self.settings.creations_per_s
        try:
            await asyncio.to_thread(self.batch.create_namespaced_job, self.settings.namespace, body)
        except ApiException as exc:
            raise LaunchError(f"creating Job {body['metadata']['name']}: {exc.status} {exc.reason}: "
                              f"{(exc.body or '')[:300]}") from exc
        except (HTTPError, OSError) as exc:
            raise LaunchError(f"the Kubernetes API is unreachable: {exc}") from exc

    async def attach(self, spec: JobSpec) -> bool:
        self._ensure_watch()
        try:
            await asyncio.to_thread(self.batch.read_namespaced_job, job_name(spec.rollout_id),
                                    self.settings.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    @staticmethod
    def _condition(job: Any) -> tuple[str, str] | None:
        for c in (job.status.conditions or []) if job is not None and job.status else []:
            if c.type in ("Complete", "Failed") and c.status == "True":
                return c.type, c.reason or ""
        return None

    async def wait(self, spec: JobSpec, timeout_s: float) -> Exit:
        self._ensure_watch()
        assert self._changed is not None
        name = job_name(spec.rollout_id)
        deadline = time.monotonic() + max(timeout_s, 0.0) + self.grace_s + 5.0  # the server's deadline comes first
        while True:
            if name in self._cancelled:
                return Exit("cancelled", None, "cancelled by the controller")
            if name in self._jobs and self._jobs[name] is None:
                return Exit("lost", None, "its Job was deleted by someone else")
            done = self._condition(self._jobs.get(name))
            if done is not None:
                break
            if time.monotonic() > deadline:  # the API server did not enforce the deadline: do it here
                await self._delete(name)
                return Exit("timeout", None, f"still running after {timeout_s:.1f} s: Job deleted")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 1.0)
        kind, reason = done
        terminated = await self._collect(spec, name)
        if kind == "Failed" and reason == "DeadlineExceeded":
            return Exit("timeout", None, f"activeDeadlineSeconds passed ({self.timeout_s:.0f} s)")
        if terminated is not None and terminated.reason in _NOT_STARTED:
            return Exit("lost", None, f"could not start: {terminated.reason}: {terminated.message or ''}".strip())
        code = terminated.exit_code if terminated is not None else (0 if kind == "Complete" else None)
        return Exit("exited", code, None if kind == "Complete" else reason)

    async def _collect(self, spec: JobSpec, name: str) -> Any:
        """The pod's terminated state, and its log copied to the rollout's log file."""
        pods = await asyncio.to_thread(self.core.list_namespaced_pod, self.settings.namespace,
                                       label_selector=f"job-name={name}")
        if not pods.items:
            return None
        pod = pods.items[-1]
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(ApiException):
            text = await asyncio.to_thread(self.core.read_namespaced_pod_log, pod.metadata.name,
                                           self.settings.namespace)
            spec.log_path.write_text(text or "")
        statuses = pod.status.container_statuses or []
        return statuses[0].state.terminated if statuses and statuses[0].state else None

    async def _delete(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            await asyncio.to_thread(self.batch.delete_namespaced_job, name, self.settings.namespace,
                                    propagation_policy="Background")

    async def cancel(self, spec: JobSpec) -> None:
        name = job_name(spec.rollout_id)
        self._cancelled.add(name)
        await self._delete(name)
        if self._changed is not None:
            self._changed.set()

    async def close(self) -> None:
        self._closing.set()
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.join, 10.0)
        await asyncio.to_thread(self._api.close)
