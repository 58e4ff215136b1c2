"""A Python interpreter that has imported a harness's heavy modules once and forks a child per rollout.

Started by the local runner with the harness's own interpreter and only the
standard library (`python -c <this file> MODULE...`), so nothing of Tether
leaks into the harness. Each request on stdin is one JSON line
`{"argv", "env", "cwd", "log", "exit"}` where argv is what follows the
interpreter (`SCRIPT ARGS`, `-m MODULE ARGS` or `-c CODE ARGS`); the reply is
`{"pid": N}` or `{"error": "..."}`. The child runs in its own session with
the rollout's environment, output to its log, and writes its exit code to
`exit` as the local runner's `sh` wrapper does (128+N when killed by signal N,
written by this process when it reaps the child).
"""

import atexit
import contextlib
import json
import os
import runpy
import select
import signal
import sys
import threading
import traceback


def _main_of(argv: list[str]) -> int:
    """Run argv as `python ARGV` would, in this process; returns the exit code."""
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # as the interpreter does: print it, exit 1
        traceback.print_exc()
        return 1
    return 0


def _child(request: dict, started: int) -> None:  # type: ignore[type-arg]
    code = 1
    try:
        os.setsid()  # before the parent replies: the runner signals the rollout's process group
        os.write(started, b"s")
        os.close(started)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("cwd"):
            os.chdir(request["cwd"])
        code = _main_of(request["argv"])
        for thread in threading.enumerate():  # the interpreter waits for non-daemon threads before it exits
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    except BaseException:  # setting up the child failed: say why in its log
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream must not stop the exit code
                stream.flush()
        _write_exit(request["exit"], code)
        os._exit(code)


def _write_exit(path: str, code: int) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(str(code))
    os.replace(path + ".tmp", path)


def _reap(exits: dict[int, str]) -> None:
    """A killed child's exit file is written while it is still a zombie (its status read with WNOWAIT), and only
    then is it reaped: the runner, seeing the process gone, always finds the file."""
    while exits:
        try:
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if found is None or found.si_pid == 0:
            return
        path = exits.pop(found.si_pid, None)
        killed = found.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
        if path is not None and killed and not os.path.exists(path):
            _write_exit(path, 128 + found.si_status)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(found.si_pid, 0)


def serve(modules: list[str]) -> None:
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the replies only
        for name in modules:
            try:
                __import__(name)
            except Exception as exc:  # the runner says which module failed, in the rollout's launch error
                print(json.dumps({"error": f"import {name}: {exc!r}"}), file=sys.__stdout__, flush=True)
                return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller's Ctrl-C is for the controller
    exits: dict[int, str] = {}
    print(json.dumps({"ready": True}), flush=True)
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], 0.2)
        _reap(exits)
        if not readable:
            continue
        line = sys.stdin.readline()
        if not line:
            return  # the runner is gone; the children live on in their own sessions
        try:
            request = json.loads(line)
            started, ready = os.pipe()
            pid = os.fork()
        except (OSError, ValueError) as exc:
            print(json.dumps({"error": str(exc)}), flush=True)
            continue
        if pid == 0:
            os.close(started)
            _child(request, ready)
        os.close(ready)
        os.read(started, 1)  # its session exists (or it died: end of file)
        os.close(started)
        exits[pid] = request["exit"]
        print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1:])
