"""Text-embeddings-inference's API, for TEI's clients unchanged (huggingface_hub's InferenceClient, LangChain's and
LlamaIndex's TEI classes with the URL http://host:port/tei): its shapes (types.py), its requests as the services'
data and their answers in its shapes (translate.py), its HTTP routes (routes.py) and its gRPC API (grpc/)."""
