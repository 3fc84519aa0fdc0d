"""`impalajob validate -f FILE`: check a manifest without running anything.

The same checks `impalajob train` and `impalajob learner` run before they start (commands.load_job),
so a manifest this accepts is one they accept; the API server refuses the same invalid fields
through the CRD's schema and CEL rules.
"""

from __future__ import annotations

import argparse

from impala_cli.commands import add_manifest_arguments, load_job


def register(parser: argparse.ArgumentParser) -> None:
    add_manifest_arguments(parser)


def run(args: argparse.Namespace) -> int:
    job, chosen = load_job(args)
    print(f"{args.file}: ImpalaJob {job.name} is valid")
    for line in chosen:
        print(f"  for this env: {line}")
    return 0
