"""The data types every layer shares: the float GRU model and its file, the tensor table, the quantized model."""
