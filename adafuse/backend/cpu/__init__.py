"""The CPU's backend and its machinery: row tiles (tiles.py), the exact backend they make (exact.py), the blocked
vocabulary projection (projection.py), the cores threads share (cores.py), and the backend that runs a step's models
side by side (backend.py)."""
