"""The sandbox's first process: limits, the gateway's relay, then the harness.

Run inside the sandbox as `python -I -S -c <this file> SPEC -- COMMAND...`
(standard library only: nothing of Tether need be visible there). SPEC is
JSON: `rlimits` (name → value, soft and hard alike), `listen` and `port` (the
gateway's address as the harness knows it) and `socket` (the launcher's relay,
outside, which reaches the gateway and nothing else). In order:

1. every file descriptor above stderr is closed, so nothing the launcher held
   reaches the harness;
2. the limits are set: they hold for every process the harness starts, and
   no process here can raise them again (a hard limit needs a capability the
   sandbox has not got). The process count is kept per sandbox, since each
   has a user namespace of its own;
3. a listener on the gateway's address, on the sandbox's own loopback, passes
   each connection to the socket;
4. the harness runs as a child; SIGTERM, SIGINT and SIGHUP are passed on to
   it, and this process exits as it did (128+N for a death by signal N).

The harness can kill this process or take its port: it then only loses its own
way to the model. It cannot reach anything else: the network namespace has
only loopback.
"""

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading

CHUNK = 65536


def pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(CHUNK):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for end, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                end.shutdown(how)


def relay(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=relay, args=(client, path), daemon=True).start()


def listen(address: str, port: int) -> socket.socket | None:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(128)
    except OSError as exc:
        listener.close()
        if family == socket.AF_INET6:  # no IPv6 inside: the IPv4 listener serves
            return None
        print(f"tether sandbox: cannot listen on {address}:{port} for the gateway: {exc}", file=sys.stderr)
        raise SystemExit(125) from exc
    return listener


def main(argv: list[str]) -> int:
    os.closerange(3, 1 << 16)
    spec = json.loads(argv[1])
    command = argv[argv.index("--") + 1:]
    for name, value in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    for address in spec["listen"]:
        listener = listen(address, int(spec["port"]))
        if listener is not None:
            threading.Thread(target=serve, args=(listener, spec["socket"]), daemon=True).start()
    try:
        child = subprocess.Popen(command, close_fds=True)
    except OSError as exc:
        print(f"tether sandbox: {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
