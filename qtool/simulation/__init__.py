"""Simulation: the integer GRU beside the float one over data in chunks, and the distances between them."""
