"""Calibration: observe every tensor over data and build the quantized model (one method, or auto)."""
