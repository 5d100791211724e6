"""Quantization-aware training in qtool's own integer semantics (needs PyTorch: the optional extra
`qtool[torch]`). `QuantGRU.from_float(nn_gru, calib=x, bits="int8")`, fine-tune, `to_qtool(path)`."""

from qtool.qat.module import QuantGRU

__all__ = ["QuantGRU"]
