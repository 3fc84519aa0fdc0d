"""`impalajob status TARGET`: a job's training status from its sidecar, as a table or JSON.

TARGET is the sidecar's URL, a local population's run directory (its leaderboard and lineage,
from `population.json`), or an ImpalaJob name: then the URL is the job's `status.statusURL`
(set by the operator), read with the Kubernetes client from the current (or --namespace)
namespace, and the bearer token is the job's, from its auth Secret `<job>-auth` (unless
--token-file or $IMPALA_STATUS_TOKEN gives one: never the token itself on argv, where `ps` shows
it). How the sidecar is reached (directly, a port-forward, the API server's proxy) is in
`status_transport`; the table is `status_render`'s.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from impala_cli.commands import EXIT_FAILED, CommandError, add_cluster_arguments
from impala_cli.commands.population_run import SUMMARY_FILE, population_table
from impala_cli.commands.status_render import final_rows, print_rows, print_table
from impala_cli.commands.status_transport import (
    FinishedJob,
    StatusCommandError,
    base_url,
    fetch_job_status,
    fetch_status,
    is_url,
)
from impala_trainer.sidecar.models import StatusResponse


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        help="sidecar URL (http://host:8080), ImpalaJob name, or a local population's run "
        "directory (runs/<population>)",
    )
    parser.add_argument("--json", action="store_true", help="print the raw /status JSON")
    parser.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="send the bearer token in this file (or set IMPALA_STATUS_TOKEN; default for a job "
        "name: its Secret)",
    )
    add_cluster_arguments(parser, "the job's namespace (default: the context's)")
    parser.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout in seconds")


def run(args: argparse.Namespace) -> int:
    local = Path(args.target) / SUMMARY_FILE
    if local.is_file():  # a local population's run directory (`impalajob train -f population`)
        summary = json.loads(local.read_text())
        print(json.dumps(summary, indent=2) if args.json else population_table(summary))
        return 0
    token = given_token(args.token_file)
    try:
        if is_url(args.target):
            data = fetch_status(base_url(args.target), token, args.timeout)
        else:
            data = fetch_job_status(args.target, args.namespace, token, args.timeout)
    except StatusCommandError as err:
        raise CommandError(str(err), EXIT_FAILED) from None
    except FinishedJob as done:
        # Its pods (the sidecar among them) are gone; the CR keeps the final figures.
        if args.json:
            print(json.dumps(done.final, indent=2))
        else:
            print_rows(f"ImpalaJob {done.final['job']}", final_rows(done.final), "final status")
        return 0
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print_table(StatusResponse.model_validate(data))
    return 0


def given_token(token_file: Path | None) -> str | None:
    """The token the user gave: the content of `--token-file` (stripped, as the sidecar reads
    its own), else $IMPALA_STATUS_TOKEN, else None (a job name then reads the job's Secret)."""
    if token_file is None:
        return os.environ.get("IMPALA_STATUS_TOKEN")
    try:
        token = token_file.read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else "not text"
        raise CommandError(f"cannot read --token-file {token_file}: {why}") from None
    if not token:
        raise CommandError(f"--token-file {token_file} is empty")
    return token
