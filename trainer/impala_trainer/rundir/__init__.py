"""The run directory: its files written (`writer`, `checkpoint`, `tensorboard`), read back
robustly (`reader`), mirrored to S3 (`remote`), and the driver's counters that fill them (`stats`).
The files' types are the API's (`impala_api.snapshot`)."""
