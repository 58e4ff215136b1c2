#!/usr/bin/env bash
# `make run` until the training job lands: bring up Kafka, create the topics, check it answers, stop it.
set -euo pipefail
cd "$(dirname "$0")/.."
tether=.venv/bin/tether
trap '$tether kafka down >/dev/null 2>&1 || true' EXIT
$tether kafka up
$tether topics create
$tether kafka status
$tether kafka down
trap - EXIT
echo
echo "Kafka and the event contract work; the engine and the gateway run on their own (tether engine serve,"
echo "tether gateway serve). The training job that ties them together comes with the next issues."
