"""Jina's rerank API (/v1/rerank), for Jina's clients: its shapes (types.py) and its route (routes.py)."""
