"""ImpalaJob operator: reconciles impala.dev/v1alpha1 ImpalaJobs with kopf."""
