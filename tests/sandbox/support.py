"""What the sandbox's tests share: a stand-in gateway, the agent's shell in a rollout's sandbox, a wait
for a launcher's lock."""

from __future__ import annotations

import fcntl
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from infra.sandbox.policy import Policy

REPO = Path(__file__).resolve().parent.parent.parent
VENV_FILE = Path(sys.prefix) / "pyvenv.cfg"


class Server:
    """An HTTP server on loopback answering every GET with its name."""

    def __init__(self, name: str) -> None:
        body = name.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def sandboxed(site: Path, gateway: Server, script: str, *, env: dict[str, str] | None = None,
              timeout: float = 120, **policy: object) -> subprocess.CompletedProcess[str]:
    """`sh -c script` as the agent, in work/mine."""
    workdir = site / "work" / "mine"
    spec = Policy.model_validate({"workdir": str(workdir), "gateway": f"http://127.0.0.1:{gateway.port}",
                                  "hide": [str(site / "tasks")], **policy})
    environ = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **(env or {})}
    return subprocess.run([sys.executable, "-m", "infra.sandbox", spec.model_dump_json(), "--", "sh", "-c", script],
                          cwd=workdir, env=environ, capture_output=True, text=True, timeout=timeout)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wait_held(workdir: Path, timeout_s: float = 30) -> None:
    """Until a launcher holds the working copy's lock (it does from before the sandbox is made to its end)."""
    deadline = time.monotonic() + timeout_s
    handle = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
            except BlockingIOError:
                return
            time.sleep(0.02)
    finally:
        os.close(handle)
    raise AssertionError(f"no launcher took {workdir} within {timeout_s} s")
