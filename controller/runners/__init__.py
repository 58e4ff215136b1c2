"""Where harnesses run: local processes or Kubernetes Jobs, behind one interface (`base.Runner`)."""
