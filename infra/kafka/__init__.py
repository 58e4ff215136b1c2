"""A single-node Apache Kafka broker (KRaft, broker+controller) fetched with Maven and run by PID."""
