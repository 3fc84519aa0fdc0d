"""The job's lifecycle, decided: runPolicy, .status from children, one reconcile planned. Pure."""
