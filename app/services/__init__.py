"""What the endpoints compute, by concern: embeddings and tokens, inspection, the service's description.

Each service method takes the served model and a validated request, runs the work through the model's
tokenisation stage and queue, and returns a typed response (``app/schemas.py``) in a ``Reply``.
"""
