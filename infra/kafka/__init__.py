"""The local Apache Kafka (KRaft), fetched with Maven and run by PID: one node, or a cluster of them, plaintext or
SASL_SSL with a user per service and ACLs."""
