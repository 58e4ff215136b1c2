"""Kubernetes manifests of the whole system, rendered from the project's own tables (`infra.k8s.render`)."""
