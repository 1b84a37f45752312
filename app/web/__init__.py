"""The HTTP layer under the routes: middleware (request lines, body timeout, limits), the routes' dependencies,
serialisation of the answers (JSON, npz, base64) and the hot routes' short way in (fast_path.py)."""
