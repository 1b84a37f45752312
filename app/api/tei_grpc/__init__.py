"""Text-embeddings-inference's gRPC API (its ``tei.v1`` proto, tei.proto here), served beside HTTP with
ENCODER_GRPC_PORT: server.py. tei_pb2*.py are generated from the proto (``make proto``); do not edit them."""
