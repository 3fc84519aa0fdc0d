"""The ImpalaJob operator, in rooms: `build` (job -> child manifests), `lifecycle` (runPolicy,
.status, one reconcile planned), `scale` (autoscaling) are pure; `runtime` does the I/O;
`settings` configures them all."""
