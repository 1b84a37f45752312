"""Between the routes and the engine: the served models (registry.py), their tokenisation stage
(tokenization.py), admission (admission.py) and the way a reply is answered in time (responding.py)."""
