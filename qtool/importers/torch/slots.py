"""The names torch.ao quantizers take beside a GRU's weights in a state dict (docs/qat.md)."""

from __future__ import annotations

import re

from qtool.core.tensors import NAMES

ALIASES = {"weight_ih": "W", "weight_hh": "R", "bias_ih": "bx", "bias_hh": "br"}


_TENSOR = "|".join(sorted([*ALIASES, *(n for n in NAMES if n not in ("W", "R", "bx", "br"))], key=len, reverse=True))


SLOT = re.compile(rf"^(?P<prefix>.*?)(?:(?P<alias>{_TENSOR})_l(?P<layer>\d+)(?P<rev>_reverse)?_fake_quant"
                  rf"|(?P<output>activation_post_process))\.(?P<leaf>.+)$")
