"""One router per resource; app.py mounts them under /api/v1 (health and metrics at the root)."""
