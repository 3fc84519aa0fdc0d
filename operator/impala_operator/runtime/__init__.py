"""I/O: the kopf handlers, the Kubernetes client, leader election, the runner, the token key,
metrics and the sidecar client. The only room of the operator that calls the Kubernetes API."""
