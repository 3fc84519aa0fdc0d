"""One module per `impalajob` subcommand, each with `register(parser)` and `run(args) -> int`.

Every command reports a failure the same way, `impalajob CMD: error: ...` on stderr (argparse's
own format), by raising `CommandError`; `impala_cli.main` prints it and exits with its code. The
vocabulary is shared too: `-f/--file` a manifest (and nothing else: `logs` streams with
`--follow`, which has no short form), `--set` an override, `--run-dir` the run directory,
`--resume` "continue from its newest checkpoint when there is one", `--token-file` a file holding
a bearer token (never the token itself on argv, where `ps` shows it), `--log-level` how much a
long-running process logs (critical, error, warning, info, debug), flags named for the spec field
they come from (`--workers-per-pod`: `spec.rollouts.workersPerPod`), and every port flag names
its port (`--gcs-port`, `--status-port`, `--node-manager-port`, ...).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from impala_api.spec import ImpalaJob
    from impala_trainer.rundir.remote import Mirror
    from impala_trainer.rundir.writer import RunDir

EXIT_FAILED = 1
"""Training (or the command's own work) failed."""
EXIT_USAGE = 2
"""Bad input: an invalid manifest or arguments; nothing was started."""
EXIT_STOPPED = 130
"""Stopped by SIGINT/SIGTERM (the run was checkpointed)."""


class CommandError(Exception):
    """A failure the command explains in one message; `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def add_manifest_arguments(parser: argparse.ArgumentParser) -> None:
    """`-f/--file` and `--set`: every command that reads a manifest."""
    parser.add_argument("-f", "--file", required=True, type=Path, help="ImpalaJob manifest (YAML)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. training.lr=0.001 (repeatable)",
    )


LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
"""The choices of every `--log-level` flag (`status-server`, `operator`)."""


def add_resume_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in the run directory when there is one",
    )


def load_job(args: argparse.Namespace) -> tuple[ImpalaJob, list[str]]:
    """The manifest of `-f` with `--set` applied, validated, and the fields it omits that
    depend on the env's action space set (with a line for each: what and why); CommandError
    when it cannot run.

    Validation is the model's alone (the CRD's CEL rules restate it, so the API server refuses
    the same manifests); on top of it, what only a machine with the trainer can know: whether
    the environment can be made here and the model fits its spaces (`impala_trainer.preflight`:
    the API server imports neither gymnasium nor the job's own code).
    """
    from impala_api.manifest import ManifestError, load_manifest

    try:
        job = load_manifest(args.file, args.set)
    except ManifestError as err:
        raise CommandError(str(err)) from None
    from impala_trainer.preflight import job_problem, space_defaults

    problem = job_problem(job.spec)
    if problem is not None:
        field, why = problem
        raise CommandError(str(ManifestError(str(args.file), [f"spec.{field}: {why}"])))
    spec, chosen = space_defaults(job.spec)
    return job.model_copy(update={"spec": spec}), [str(c) for c in chosen]


def mirror_run(
    job: ImpalaJob, run_dir: RunDir, *, resume: bool, overwrite: bool = False
) -> Mirror | None:
    """The mirror of the run directory at `checkpoint.storageUri` (None without one), claimed
    for this run; when resuming, its newest checkpoint is brought down first, so a learner on a
    new pod or machine continues the run. `IMPALA_JOB_UID` (set by the operator) tells this job
    from an earlier one of the same name."""
    uri = job.spec.checkpoint.storage_uri
    if uri is None:
        return None
    import os

    from impala_trainer.rundir.remote import Mirror, StorageError, open_remote

    try:
        remote = open_remote(
            uri,
            job.name,
            run_dir.path,
            resume=resume,
            overwrite=overwrite,
            uid=os.environ.get("IMPALA_JOB_UID") or None,
        )
    except StorageError as err:
        raise CommandError(str(err), EXIT_USAGE if err.config else EXIT_FAILED) from None
    return Mirror(remote, run_dir.path, job.spec.checkpoint.keep)


def add_cluster_arguments(parser: argparse.ArgumentParser, namespace_help: str) -> None:
    """`-n/--namespace`, `--context` and `--kubeconfig`, as kubectl reads them: every command
    that looks a job up on the cluster (`kubectl impalajob status NAME -n NS --context C`)."""
    parser.add_argument("-n", "--namespace", help=namespace_help)
    parser.add_argument(
        "--context", help="the kubeconfig context to use (default: its current context)"
    )
    parser.add_argument(
        "--kubeconfig",
        help="the kubeconfig file to use (default: $KUBECONFIG, else ~/.kube/config, else the "
        "pod's in-cluster identity)",
    )
