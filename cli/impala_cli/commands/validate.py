"""`impalajob validate -f FILE`: check a manifest without running anything (an ImpalaJob, or an
ImpalaPopulation: then the members it draws are listed).

The same checks `impalajob train` and `impalajob learner` run before they start (commands.load_job),
so a manifest this accepts is one they accept; the API server refuses the same invalid fields
through the CRD's schema and CEL rules.
"""

from __future__ import annotations

import argparse

from impala_cli.commands import CommandError, add_manifest_arguments, load_job


def register(parser: argparse.ArgumentParser) -> None:
    add_manifest_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from impala_api.manifest import ManifestError, load_population, manifest_kind

    try:
        if manifest_kind(args.file) == "ImpalaPopulation":
            population = load_population(args.file, args.set)
            from impala_api.population.members import draw_members

            print(f"{args.file}: ImpalaPopulation {population.name} is valid")
            for member in draw_members(population.name, population.spec):
                print(f"  {member.name}: {member.values or 'the template as it is'}")
            return 0
    except ManifestError as err:
        raise CommandError(str(err)) from None
    job, chosen = load_job(args)
    print(f"{args.file}: ImpalaJob {job.name} is valid")
    for line in chosen:
        print(f"  for this env: {line}")
    return 0
