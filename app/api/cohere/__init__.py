"""Cohere's v2 API (/v2/embed, /v2/rerank), for Cohere's clients: its shapes (types.py), its requests as the
services' data and their answers in its shapes (translate.py), its routes (routes.py)."""
