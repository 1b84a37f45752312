"""The engine: what runs the models' passes. A task (messages.py) enters a served model's queue (work_queue.py),
its inference threads (worker.py) batch it into passes computed on the compute lanes (compute.py); with front ends
in processes of their own the engine is a process of its own, reached over a socket (remote.py, wire.py)."""
