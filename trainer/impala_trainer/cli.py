"""`impalajob`: one entry point for every role and tool.

Each subcommand lives in its own module exposing `register(parser)` and `run(args) -> int`; only
the chosen one is imported, so `impalajob crd` or `impalajob status` start without torch or Ray.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("impala_trainer.commands.train", "train locally from an ImpalaJob manifest"),
    "learner": ("impala_trainer.commands.learner", "learner pod: Ray head + driver + learner"),
    "rollout-node": ("impala_trainer.commands.nodes", "rollout pod: join the learner Ray cluster"),
    "aggregator-node": (
        "impala_trainer.commands.nodes",
        "aggregator pod: join the learner Ray cluster",
    ),
    "status-server": ("impala_trainer.status.server", "serve a run directory over REST"),
    "status": ("impala_trainer.commands.status", "print a job's training status"),
    "validate": ("impala_trainer.commands.validate", "validate an ImpalaJob manifest"),
    "crd": ("impala_operator.crd", "print the ImpalaJob CustomResourceDefinition"),
    "operator": ("impala_operator.main", "run the ImpalaJob operator"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="impalajob", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).register(p)
    args = parser.parse_args(argv)
    mod = importlib.import_module(COMMANDS[args.command][0])
    return int(mod.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
