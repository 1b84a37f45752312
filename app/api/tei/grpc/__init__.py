"""Text-embeddings-inference's gRPC API (its ``tei.v1`` proto, tei.proto here), served beside HTTP with
ENCODER_GRPC_PORT: server.py. tei_pb2*.py are generated from the proto (``make proto``); do not edit them.

grpcio's fork handlers are turned off here, before grpc is first imported, unless the environment sets them: with
them on, every fork() while gRPC's threads run logs "Other threads are currently calling into gRPC, skipping fork()
handlers", and OpenVINO's conversion of a model forks about 40 times while the service loads. The service never forks
to go on using gRPC in the child (its front ends are spawned, its subprocesses exec), which is what they are for."""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
