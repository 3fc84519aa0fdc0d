"""The sidecar's routers, one per concern; `main.create_app` includes them."""
