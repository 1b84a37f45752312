"""What the endpoints compute, by concern: embeddings and tokens, tasks, inspection, the service's description.

Each service method takes the served model and a validated request, runs the work through the model's
tokenisation stage and queue, and returns its result as data (arrays and dataclasses: ``Embedded``, ``Ranked``,
``Attended``, …); each API's route writes that data in its own shape (app/api/).
"""
