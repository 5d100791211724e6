"""Whole models in integers: the passes over a graph, the calibration of every edge, the integer
simulation and the file of a quantized graph (docs/graph.md)."""
