"""What Tether runs beside its services: the Kafka broker (`kafka/`), Grafana's dashboard (`grafana/`), the
Kubernetes manifests, rendered and tested (`k8s/`), the operating-system process helpers that the broker's
launcher, `tether up`, the controller's local runner, the coding tasks' test runs and the benchmarks share
(`processes.py`), and the supervisor that holds a server's socket across its restarts (`supervisor.py`,
`serving.py`).
"""
