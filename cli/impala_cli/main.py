"""`impalajob`: one entry point for every role and tool.

Each subcommand lives in its own module under `commands/` exposing `register(parser)` and
`run(args) -> int`; only the chosen one is imported, so `impalajob crd` or `impalajob status`
start without torch or Ray.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import signal
import sys
from collections.abc import Collection

from impala_cli.commands import CommandError, cluster

# name -> (module, one-line help)
COMMANDS: dict[str, str] = {
    "train": "train locally from an ImpalaJob manifest",
    "validate": "validate an ImpalaJob manifest",
    "evaluate": "play a trained policy for N episodes (greedy), optionally recording videos",
    "export": "write a trained policy as ONNX or TorchScript with a JSON sidecar",
    "status": "print a job's training status",
    "logs": "print the logs of a job's learner, sidecar, rollout or aggregator pods",
    "learner": "learner pod: Ray head + driver + learner",
    "learner-node": "learner pod of rank 1..N-1 (learner.replicas): join the head's Ray cluster",
    "rollout-node": "rollout pod: join the learner's Ray cluster",
    "aggregator-node": "aggregator pod: join the learner's Ray cluster",
    "status-server": "serve a run directory over REST (the status sidecar)",
    "operator": "run the ImpalaJob operator",
    "crd": "print the ImpalaJob CustomResourceDefinition",
}
# The nodes that join the learner's Ray cluster share one module.
_MODULES = {"rollout-node": "nodes", "aggregator-node": "nodes", "learner-node": "nodes"}


def command_module(name: str) -> str:
    """The module under impala_cli.commands that implements subcommand `name`."""
    return "impala_cli.commands." + _MODULES.get(name, name.replace("-", "_"))


def build_parser(
    registered: Collection[str] = (), prog: str = "impalajob"
) -> argparse.ArgumentParser:
    """The `impalajob` parser: every subcommand by name and help, and the arguments of those in
    `registered` (each imports its module: `main` registers only the one chosen, the reference
    pages all of them)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        # Flags are written whole: no prefix of one is read as another (`--token SECRET` would
        # otherwise be `--token-file SECRET`, and the secret read as a path).
        p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        if name in registered:
            importlib.import_module(command_module(name)).register(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    # `kill -USR1 PID` prints where each thread of a running command is (a run that hangs).
    if sys.__stderr__ is not None:  # the process's own stderr, whatever a caller swapped in
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    # Installed as `kubectl-impalajob` too: kubectl runs it for `kubectl impalajob ...`.
    plugin = os.path.basename(sys.argv[0]).startswith("kubectl-")
    parser = build_parser(
        [chosen] if chosen is not None else [], "kubectl impalajob" if plugin else "impalajob"
    )
    args = parser.parse_args(argv)
    if hasattr(args, "context"):  # a command that looks jobs up: kubectl's flags pick the cluster
        cluster.use(cluster.Target(args.kubeconfig, args.context))
    mod = importlib.import_module(command_module(args.command))
    try:
        return int(mod.run(args) or 0)
    except CommandError as err:
        print(f"impalajob {args.command}: error: {err}", file=sys.stderr, flush=True)
        return err.code


if __name__ == "__main__":
    sys.exit(main())
