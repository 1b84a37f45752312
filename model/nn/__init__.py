"""The torch maths, bottom-up: the encoder (attention, positions, layers), pooling and the heads, inspection, and
the GPU kernels of our own."""
