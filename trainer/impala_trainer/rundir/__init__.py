"""The run directory: its files typed (`snapshot`), written (`writer`, `checkpoint`), read back
robustly (`reader`), and the driver's counters that fill them (`stats`)."""
