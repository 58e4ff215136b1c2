"""Faults under load: parts of a live run SIGKILLed one at a time, with figures per fault and the run checked after.

    .venv/bin/python bench/chaos.py [--warmup 30] [--settle 25] [--down 5] [--concurrency 4] [--turns 8]
                                    [--faults broker,gateway-replica,gateway-restart,processors,trainer,controller]
                                    [--replicas 2] [--keep] [--security sasl_ssl]

The run: a three-broker KRaft cluster (the project's launcher, replication
factor 3, min.insync.replicas 2; plaintext, or with --security sasl_ssl TLS,
a SCRAM user per service and ACLs), `tether up`'s stack with `--replicas`
gateways (two by default, behind HAProxy; one is `tether up`'s default), the processors, a second processors worker
sharing tether.calls' partitions (same app id, its own state folder, no
analytics sink), the trainer updating every `--batch-groups` task groups, and
`tether controller run` as its own process running bench/chaos_harness.py
(the openai SDK, non-streaming and streaming calls alternately, one every
`--interval` s for `--turns` turns, then a reward). Each harness appends a
line per call to a file the bench reads.

The faults, one at a time, each SIGKILL followed by `--down` s without the
part, its restart, and `--settle` s of quiet:
  broker           the leader of tether.calls' partition 0, restarted on its intact disk
  gateway-replica  gateway-1 of the two (HAProxy sends its rollouts to gateway-2), then `tether up` again
  gateway-restart  the gateway's server process only (gateway-1's with replicas): its supervisor starts it
                   again at once on the socket it holds, calls wait in the backlog meanwhile (no `--down`)
  processors       the stack's worker (the other keeps running), then `tether up` again
  trainer          then `tether up` again (it resumes from its checkpoint and settles an interrupted update)
  controller       then started again (it re-attaches to the harnesses still running)

Per fault: time to recover (broker, replica, restart: the part ready again; processors:
the next task group on tether.samples; trainer: the next weight version
published; controller: the next rollout launched) and the first call that
succeeded after the kill; calls/s and p99 latency as the harnesses saw them
before (the `--settle` s before the kill, at most 20), during (kill → part
back) and after (the same span after it); calls failed. After the run:
every call a harness got a 200 for is on tether.calls exactly once (matched
by the response id, which the gateway also records inside ModelCall's
response_json), each rollout's seqs unique, every rollout finished and none
failed, task groups exactly once on tether.samples, the replay equal to what
was trained, weight versions advancing across every fault. The plot goes to
bench/results/chaos.png.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from typing import Any

from chaos_checks import Check, checks
from chaos_report import fault_table, plot, read_calls
from chaos_run import FAULTS, Run, prepare
from rich.console import Console
from rich.table import Table

from _shared import arguments

# The entry: the command line, the run's order (bench/chaos_run.py starts the parts and inflicts each fault,
# bench/chaos_monitor.py follows the topics meanwhile) and what it prints; the figures come from
# bench/chaos_report.py, the checks from bench/chaos_checks.py.

console = Console(width=max(160, shutil.get_terminal_size().columns))


def main() -> None:
    args = parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # a killed broker is expected here
    run = prepare(args)
    try:
        live(run)
        calls = read_calls(run.calls_dir)
        with console.status("reading the run back from the topics..."):
            found, recorded = checks(run, calls)
    finally:
        tear_down(run)
    print_results(run, calls, found)
    plot(run, calls, recorded, args.out, console)


def parse_args() -> argparse.Namespace:
    parser = arguments(__doc__, "chaos.png")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, in order, of: "
                        + ", ".join(FAULTS))
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds of load before the first fault")
    parser.add_argument("--settle", type=float, default=25.0, help="seconds after a part is back")
    parser.add_argument("--down", type=float, default=5.0, help="seconds a killed part stays down")
    parser.add_argument("--tail", type=float, default=10.0, help="seconds for the processors after the stop")
    parser.add_argument("--concurrency", type=int, default=4, help="harnesses at once")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--batch-groups", type=int, default=2, help="task groups per update")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between a harness's calls")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--heap", default="384m", help="each broker's JVM heap")
    parser.add_argument("--security", choices=("plaintext", "sasl_ssl"), default="plaintext",
                        help="the cluster's listeners: sasl_ssl gives every service its own user, TLS and ACLs")
    parser.add_argument("--replicas", type=int, default=2, help="gateways; 1 is `tether up`'s default (no HAProxy)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, calls, checkpoints)")
    args = parser.parse_args()
    args.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    if unknown := set(args.faults) - set(FAULTS):
        parser.error(f"unknown faults {sorted(unknown)}; choose from {FAULTS}")
    if args.replicas < 1 or (args.replicas == 1 and "gateway-replica" in args.faults):
        parser.error("gateway-replica needs --replicas 2 or more (one gateway has no other to take over)")
    return args


def live(run: Run) -> None:
    """The cluster, the stack and the load started; the faults one at a time; the controller stopped."""
    start(run)
    for name in run.args.faults:
        with console.status(f"fault: {name}"):
            fault = run.fault(name)
        console.print(f"{fault.what}: killed at +{fault.killed - run.started:.1f} s, back after "
                      f"{fault.back - fault.killed:.1f} s; settling {run.args.settle:.0f} s")
        run.faults.append(fault)
        if run.second_worker is not None and run.second_worker.poll() is not None:
            console.print(f"[red]the second processors worker exited with {run.second_worker.returncode}[/red]")
        time.sleep(run.args.settle)
        run.finish_recovery(fault)
    run.stopped = time.time()
    if not run.stop_controller():
        console.print("[red]the controller did not stop within 90 s of SIGINT; killed[/red]")
    console.print(f"controller stopped at +{run.stopped - run.started:.0f} s; letting the processors catch up")
    time.sleep(run.args.tail)


def start(run: Run) -> None:
    with console.status("three KRaft brokers..."):
        t = time.time()
        run.broker.start()
    console.print(f"Kafka: 3 brokers on {run.broker.bootstrap}, {run.args.security} ({time.time() - t:.0f} s)")
    gateways = "1 gateway" if run.args.replicas == 1 else f"{run.args.replicas} gateway replicas + HAProxy"
    with console.status(f"tether up: engine, {gateways}, processors, trainer..."):
        t = time.time()
        run.stack.up()
        run.start_second_worker()
    console.print(f"stack up ({time.time() - t:.0f} s); logs in {run.stack.logs}")
    run.monitor.start()
    run.write_controller_config()
    run.started = time.time()
    run.start_controller()
    console.print(f"controller started; warming up {run.args.warmup:.0f} s")
    time.sleep(run.args.warmup)


def tear_down(run: Run) -> None:
    run.stop_own_parts()
    with console.status("tether down..."):
        run.stack.down(keep_kafka=True)
        run.broker.stop(force=True)
    if run.args.keep:
        console.print(f"kept: {run.scratch} (logs: {run.stack.logs}, harness calls: {run.calls_dir})")
    else:
        shutil.rmtree(run.scratch, ignore_errors=True)


def print_results(run: Run, calls: list[dict[str, Any]], found: list[Check]) -> None:
    console.print(fault_table(run, calls))
    console.print("recovered: broker, replica, restart = the part ready again; processors = next task group on "
                  "tether.samples; trainer = next version published; controller = next rollout launched.")
    summary = Table(title="checks after the run")
    for column in ("check", "", "detail"):
        summary.add_column(column)
    for c in found:
        summary.add_row(c.name, "[green]ok[/green]" if c.ok else "[red]FAILED[/red]", c.detail)
    console.print(summary)


if __name__ == "__main__":
    main()
