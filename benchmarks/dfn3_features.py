"""DeepFilterNet3's block inputs from a wave, as its `df.enhance.df_features` computes them (48 kHz,
FFT 960, hop 480, 32 ERB bands, 96 deep-filter bins, normalization alpha 0.99), for
`benchmarks/published_models.py`: the encoder's features, and each decoder's inputs from the
encoder's float outputs (ONNX Runtime). Needs DeepFilterLib (`pip install DeepFilterLib`), scipy,
soundfile and onnxruntime; none is a qtool dependency.

    python benchmarks/dfn3_features.py mix.wav DeepFilterNet3_onnx/ out/
    python benchmarks/published_models.py DeepFilterNet3_onnx/enc.onnx --calib out/enc_calib.npz \\
        --test out/enc_test.npz --verify 0

The README's figures: GTCRN's test_wavs/mix.wav, 6 clips of 100 frames starting at frames 0, 80,
..., 400 to calibrate (the first 5 s), the frames from 500 on to test.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

CLIPS, CLIP, HELD = (0, 80, 160, 240, 320, 400), 100, 500


def features(wave: Path) -> dict[str, np.ndarray]:
    """feat_erb [T, 1, 32] and feat_spec [T, 2, 96] (real, imaginary), frames as qtool reads a
    PyTorch map [N, C, T, F]: [N, T, C, F]."""
    import soundfile as sf
    from libdf import DF, erb, erb_norm, unit_norm
    from scipy.signal import resample_poly

    x, sr = sf.read(wave, dtype="float32")
    x = resample_poly(x if x.ndim == 1 else x[:, 0], 48000, sr).astype(np.float32)
    df = DF(sr=48000, fft_size=960, hop_size=480, nb_bands=32, min_nb_erb_freqs=2)
    spec = df.analysis(x[None])
    erb_feat = erb_norm(erb(spec, df.erb_widths()), 0.99)[0]
    spec_feat = unit_norm(spec[..., :96].copy(), 0.99)[0]
    return {"feat_erb": erb_feat[:, None, :].astype(np.float32),
            "feat_spec": np.stack([spec_feat.real, spec_feat.imag], 1).astype(np.float32)}


def split(frames: dict[str, np.ndarray]) -> tuple[dict, dict]:
    calib = {k: np.stack([v[s:s + CLIP] for s in CLIPS]) for k, v in frames.items()}
    return calib, {k: v[None, HELD:] for k, v in frames.items()}


def encoder_outputs(path: Path, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The encoder's outputs, a sequence at a time (the file's batch is 1), maps back to [N, T, C, F]."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    runs = [sess.run(None, {k: v[i:i + 1].transpose(0, 2, 1, 3) for k, v in data.items()})
            for i in range(len(next(iter(data.values()))))]
    out = {n: np.concatenate([r[j] for r in runs]) for j, n in enumerate(names)}
    return {k: v.transpose(0, 2, 1, 3) if v.ndim == 4 else v for k, v in out.items()}


def main() -> None:
    import onnxruntime as ort

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wave", type=Path)
    ap.add_argument("models", type=Path, help="the folder of enc.onnx, erb_dec.onnx and df_dec.onnx")
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    calib, test = split(features(args.wave))
    enc = {"calib": encoder_outputs(args.models / "enc.onnx", calib),
           "test": encoder_outputs(args.models / "enc.onnx", test)}
    for part, data in (("calib", calib), ("test", test)):
        np.savez(args.out / f"enc_{part}.npz", **data)
        for block in ("erb_dec", "df_dec"):
            inputs = [i.name for i in ort.InferenceSession(str(args.models / f"{block}.onnx")).get_inputs()]
            np.savez(args.out / f"{block}_{part}.npz", **{k: enc[part][k] for k in inputs})
    print(f"features of {args.wave.name} -> {args.out}")


if __name__ == "__main__":
    main()
