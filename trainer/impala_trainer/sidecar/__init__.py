"""The status sidecar: a read-only FastAPI service over a run directory.

It reads only the files `impala_api.snapshot` defines (status.json, history.jsonl,
summary.json) and never talks to the trainer, so it keeps answering when the learner crashes.
`server.py` is the `impalajob status-server` command; `main.create_app` builds the app.
"""
