"""ONNX graphs: GRU nodes, constant folding, external data, QDQ ranges, and the check against ONNX Runtime."""
