"""Output formats. Exporters only read a quantized model; they never recompute numerics."""
