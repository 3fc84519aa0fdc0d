"""The `impalajob` command line: the composition root above the API, the trainer and the
operator (the one package that imports them all)."""
