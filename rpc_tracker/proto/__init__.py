"""Generated gRPC modules of farm.proto (built at install time by setup.py, not committed)."""
