"""One module per `impalajob` subcommand, each with `register(parser)` and `run(args) -> int`."""
