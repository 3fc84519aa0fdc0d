"""`impalajob logs NAME [--role learner|rollout|aggregator|status] [--follow]`: an ImpalaJob's
pod logs.

The pods are found by the labels the operator puts on them (`impala_api.names`: the job's
instance and component labels), so the user needs neither pod names nor attempt numbers:
`learner` is the current attempt's learner container (`--previous-attempt` the one before it),
`status` its sidecar, `rollout`/`aggregator` every pod of the group, each line prefixed with its
pod. `-f` is `--file` in every impalajob command, so `--follow` has no short form, and the
`kubectl logs -f` habit gets a usage error saying so.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from impala_api import names
from impala_cli.commands import EXIT_FAILED, CommandError, add_cluster_arguments
from impala_cli.commands.cluster import NoClusterError, connect

_CONTAINERS: dict[str, tuple[names.Component, str]] = {
    # role -> (pods' component label, container)
    "learner": ("learner", "learner"),
    "status": ("learner", "status"),
    "rollout": ("rollout", "rollout"),
    "aggregator": ("aggregator", "aggregator"),
}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="ImpalaJob name")
    parser.add_argument(
        "--role", choices=list(_CONTAINERS), default="learner", help="whose logs (default learner)"
    )
    add_cluster_arguments(parser, "the job's namespace (default: the context's)")
    parser.add_argument("--follow", action="store_true", help="stream new lines (one pod)")
    parser.add_argument("--tail", type=int, default=None, help="last N lines of each pod")
    parser.add_argument(
        "--previous-attempt",
        action="store_true",
        help="the learner attempt before the current one (e.g. the one that failed)",
    )


def select_pods(pods: list[dict[str, Any]], role: str, previous: bool) -> list[dict[str, Any]]:
    """The pods whose logs to print: for the learner roles one attempt, else all, by name."""
    if role not in ("learner", "status"):
        return sorted(pods, key=lambda p: p["metadata"]["name"])
    by_attempt = sorted(
        pods, key=lambda p: int(p["metadata"].get("labels", {}).get(names.RESTART_KEY, "0"))
    )
    if previous:
        return by_attempt[-2:-1]
    return by_attempt[-1:]


def run(args: argparse.Namespace) -> int:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        namespace = connect(args.namespace).namespace
    except NoClusterError as err:
        raise CommandError(str(err), EXIT_FAILED) from err
    component, container = _CONTAINERS[args.role]
    core = client.CoreV1Api()
    selector = names.selector_string(args.name, component)
    try:
        listed = core.list_namespaced_pod(namespace, label_selector=selector)
    except ApiException as err:
        raise CommandError(f"cannot list pods: {err.status} {err.reason}", EXIT_FAILED) from err
    pods = select_pods(
        [client.ApiClient().sanitize_for_serialization(p) for p in listed.items],
        args.role,
        args.previous_attempt,
    )
    if not pods:
        which = "previous attempt's " if args.previous_attempt else ""
        raise CommandError(
            f"no {which}{args.role} pod of ImpalaJob {namespace}/{args.name} "
            "(is it running, and is this its namespace? see `kubectl get ij -A`)",
            EXIT_FAILED,
        )
    if args.follow and len(pods) > 1:
        raise CommandError(
            f"--follow streams one pod; {args.role} has {len(pods)}: use kubectl logs -f POD"
        )
    prefix = args.role in ("rollout", "aggregator")  # a group: say whose line it is
    for pod in pods:
        name = pod["metadata"]["name"]
        try:
            if args.follow:
                stream = core.read_namespaced_pod_log(
                    name, namespace, container=container, follow=True, tail_lines=args.tail,
                    _preload_content=False,
                )  # fmt: skip
                for line in stream:
                    sys.stdout.write(line.decode(errors="replace"))
                    sys.stdout.flush()
                continue
            text = core.read_namespaced_pod_log(
                name, namespace, container=container, tail_lines=args.tail
            )
        except ApiException as err:
            raise CommandError(
                f"cannot read the logs of {name}/{container}: {err.status} {err.reason}",
                EXIT_FAILED,
            ) from err
        for line in str(text).splitlines():
            print(f"[{name}] {line}" if prefix else line)
    return 0
