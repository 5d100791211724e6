"""Make the bundled sample: a 2-layer GRU (hidden 64) that classifies scikit-learn's handwritten
digits read row by row (8 time steps of 8 pixels), plus calibration and held-out test data.

Needs torch, safetensors and scikit-learn (not qtool's dependencies). Run from the repository root:
    python samples/make_sample.py
Writes samples/digits_gru.pt and .safetensors (state_dict: gru.* and head.*), digits_head.npz (the classifier,
for torch-free evaluation), calib.npy, test.npy, test_labels.npy, and digits.onnx: the whole classifier
(GRU -> last step -> Linear) as `torch.onnx.export` writes it. `python samples/make_sample.py onnx` writes
digits.onnx alone from digits_gru.pt.
"""

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

HERE = Path(__file__).parent
HIDDEN, LAYERS, EPOCHS, SEED = 64, 2, 60, 0


class DigitsGRU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(8, HIDDEN, num_layers=LAYERS, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, 10)

    def forward(self, x):
        y, _ = self.gru(x)
        return self.head(y[:, -1])


def export_onnx(net: DigitsGRU) -> None:
    """The whole model as users export it: batch and steps left free."""
    net.eval()
    torch.onnx.export(net, torch.zeros(2, 8, 8), str(HERE / "digits.onnx"), dynamo=False, input_names=["rows"],
                      output_names=["logits"], dynamic_axes={"rows": {0: "batch", 1: "steps"}, "logits": {0: "batch"}})


def main() -> None:
    from sklearn.datasets import load_digits

    torch.manual_seed(SEED)
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)  # [1797, 8, 8]: rows are time steps
    labels = digits.target.astype(np.int64)
    order = np.random.RandomState(SEED).permutation(len(x))
    train, test = order[:1200], order[1200:]
    calib = train[:400]  # calibration data comes from the training split, never from test
    net = DigitsGRU()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x[train]), torch.from_numpy(labels[train])
    for _ in range(EPOCHS):
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            loss = torch.nn.functional.cross_entropy(net(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        acc = (net(torch.from_numpy(x[test])).argmax(1).numpy() == labels[test]).mean()
    print(f"float test accuracy: {100 * acc:.2f}%")
    torch.save(net.state_dict(), HERE / "digits_gru.pt")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()},
              str(HERE / "digits_gru.safetensors"))
    np.savez(HERE / "digits_head.npz", weight=net.head.weight.detach().numpy(),
             bias=net.head.bias.detach().numpy())
    np.save(HERE / "calib.npy", x[calib])
    np.save(HERE / "test.npy", x[test])
    np.save(HERE / "test_labels.npy", labels[test])
    export_onnx(net)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["onnx"]:
        net = DigitsGRU()
        net.load_state_dict(torch.load(HERE / "digits_gru.pt"))
        export_onnx(net)
    else:
        main()
