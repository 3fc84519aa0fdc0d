"""Job → child manifests: pod templates, children, per-job tokens. Pure: no API calls."""
