"""Keras `.keras` and legacy `.h5` files, QKeras quantizers, and the check against Keras itself."""
