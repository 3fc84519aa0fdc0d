"""The ImpalaJob API: the custom resource's types, names and CRD, and the run directory's status
snapshot. The operator, the trainer and the CLI import it; it imports none of them."""
