"""The HTTP API: one router per endpoint family (the native routes, OpenAI's, TEI's, Cohere's and Jina's
shapes) and the request and response schemas. Each route validates, hands its work to a service, and answers."""
