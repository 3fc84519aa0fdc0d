"""`impalajob crd [-o FILE]`: print (or write) the ImpalaJob and ImpalaPopulation
CustomResourceDefinitions."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from impala_api.crd_file import render


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", help="write to FILE instead of stdout")


def run(args: argparse.Namespace) -> int:
    text = render()
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0
