"""Written for rocmfix's tests: settings with no per-device function."""

SETTINGS = {"acme": {"block_size": 64}}
