"""The resources of the manifests, one module per group that is deployed and reasoned about together."""
