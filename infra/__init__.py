"""What Tether runs beside its services on one machine: the Kafka broker (`kafka/`), the operating-system
process helpers that the broker's launcher, `tether up` and the controller's local runner share
(`processes.py`), ClickHouse tables and queries (`clickhouse/`) and Kubernetes examples (`k8s/`).
"""
