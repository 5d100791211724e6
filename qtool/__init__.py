"""qtool: integer-only GRUs for microcontrollers and DSPs, calibrated and simulated bit-exactly."""

__version__ = "0.1.0"
