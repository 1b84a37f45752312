"""A model loaded and run: its weights read onto the device in a precision, the embedding pass behind one seam
(eager, traced, CUDA graphs, OpenVINO), the loaded model (TextEncoder), and what each kind of task computes with it
(tasks.py)."""
