"""What Tether runs beside its services on one machine: the Kafka broker.

ClickHouse DDL and Kubernetes manifests join it with the issues that need them.
"""
