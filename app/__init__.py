"""The FastAPI service around the encoder of ``model/``."""

__version__ = "0.1.0"
