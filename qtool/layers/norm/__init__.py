"""The normalizations: batchnorm (a per-channel affine) and layernorm (over groups of channels)."""
