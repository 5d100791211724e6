"""PyTorch state dicts (`.pt`/`.pth`, `.safetensors`), fake-quant state, and the check against `nn.GRU`."""
