"""What the tests and the benchmarks both run, and neither owns: `tests/` and `bench/` import
each other's code never, this package always (run from the repository root, or with it on
`sys.path`). It imports nothing from either, and is not part of the wheel.

- `cluster`: a real Kubernetes control plane (etcd, kube-apiserver, controllers, kwok nodes, a
  real node, Kueue, versitygw) as local processes; `python -m harness.cluster [--real-node]`
  starts one by hand, `harness/cluster/setup.sh` builds and caches its binaries.
- `queues`: Kueue queues and quotas computed from a job's own pod sets.
- `multipod_cluster`: a multi-pod ImpalaJob as local processes.
- `sample_run`: a plausible run directory, written through the product's snapshot models.
- `net`: `free_port`.
"""
