"""OpenAI's embeddings API (/v1/models, /v1/embeddings), for OpenAI's clients and the adapters built on them: its
shapes (types.py), its requests as the services' data and their answers in its shape (translate.py), its routes
(routes.py)."""
