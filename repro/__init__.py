"""Reproducibility: how far two runs of the same tasks and seeds agree, call by call, and where they part."""
