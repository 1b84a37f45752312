"""The FastAPI service."""
