"""The HTTP API: the native routes, one module per endpoint family (their shapes in app/schemas.py), and one folder
per other API's dialect (openai/, tei/, cohere/, jina/: its shapes, its translation to and from the services' data,
its routes). Each route validates, hands its work to a service, and answers."""
