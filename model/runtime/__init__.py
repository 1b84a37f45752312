"""A model loaded and run: its weights read onto the device in a precision, the embedding pass behind one seam
(eager, traced, CUDA graphs, OpenVINO), and the loaded model (TextEncoder) with everything it computes."""
