"""Held-out keyword clips for ARM's ML-KWS-for-MCU keyword spotters, spoken rather than synthetic
noise: each word said by espeak-ng (8 English voices, its voice variants, random speed, pitch and
level) at a random offset in 1 s at 16 kHz, over white, pink or brown noise at 10-40 dB SNR, and
noise alone for `_silence_`. The variants are split between the calibration and the test clips,
so no test voice is heard in calibration. Features are ARM's own front end: each clip's wav bytes
fed to the frozen graph's `wav_data:0` (DecodeWav, AudioSpectrogram 640/320, Mfcc 40 bands,
10 coefficients), read at `Reshape_1:0`, the CRNNs' input [49, 10, 1].

    apt-get install espeak-ng; pip install tensorflow-cpu==2.15.1 scipy
    python benchmarks/kws_clips.py ML-KWS-for-MCU/Pretrained_models/CRNN/CRNN_S.pb OUT/

writes OUT/calib.npy [300, 49, 10, 1], OUT/test.npy [1200, 49, 10, 1] and their *_labels.npy
(index into LABELS), for `benchmarks/published_models.py --calib OUT/calib.npy --test
OUT/test.npy`. Deterministic: fixed seeds, and espeak-ng is for fixed parameters.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import tempfile
from pathlib import Path

import numpy as np

LABELS = ["_silence_", "_unknown_", "yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
UNKNOWN = ["bed", "bird", "cat", "dog", "eight", "five", "four", "happy", "house", "marvin",
           "nine", "one", "seven", "sheila", "six", "three", "tree", "two", "wow", "zero"]
VOICES = ["en", "en-us", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd", "en-029", "en-us-nyc"]
VARIANTS = Path("/usr/lib/x86_64-linux-gnu/espeak-ng-data/voices/!v")
SKIP = {"whisper", "whisperf", "Demonic", "UniRobot", "anikaRobot", "fast"}  # not speech-like
SR = 16000
PER_CLASS = {"calib": 25, "test": 100}
SEEDS = {"split": 1234, "calib": 1001, "test": 2002}


def split_variants() -> tuple[list[str], list[str]]:
    """A quarter of espeak-ng's voice variants for calibration, the rest for the test."""
    names = sorted(f.name for f in VARIANTS.iterdir() if f.name not in SKIP and " " not in f.name)
    order = np.random.default_rng(SEEDS["split"]).permutation(len(names))
    k = round(len(names) / 4)
    return sorted(names[i] for i in order[:k]), sorted(names[i] for i in order[k:])


def say(word: str, voice: str, speed: int, pitch: int, amp: int, tmp: Path) -> np.ndarray:
    """The word at 16 kHz, its leading and trailing silence (below -40 dB of its loudest 10 ms) cut."""
    from scipy.io import wavfile
    from scipy.signal import resample_poly

    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-a", str(amp),
                    "-w", str(tmp), word], check=True, capture_output=True)
    rate, x = wavfile.read(tmp)
    x = resample_poly(x.astype(np.float64) / 32768.0, SR, rate)
    frames = np.sqrt((x[: len(x) // 160 * 160].reshape(-1, 160) ** 2).mean(1) + 1e-20)
    loud = np.nonzero(frames > frames.max() * 0.01)[0]
    return x[max(0, loud[0] * 160 - 160):(loud[-1] + 1) * 160 + 160] if len(loud) else x[:0]


def noise(rng: np.random.Generator, kind: str) -> np.ndarray:
    """One second of white, pink (1/f power) or brown (1/f^2) noise of unit RMS."""
    y = rng.standard_normal(SR)
    if kind != "white":
        f = np.fft.rfftfreq(SR, 1.0 / SR)
        f[0] = f[1]
        spectrum = np.fft.rfft(y) / (np.sqrt(f) if kind == "pink" else f)
        spectrum[0] = 0
        y = np.fft.irfft(spectrum, SR)
    return y / np.sqrt(np.mean(y ** 2))


def clip(rng: np.random.Generator, label: int, word: str, variants: list[str], tmp: Path) -> np.ndarray:
    """One 1 s clip of `word` (noise alone for `_silence_`), int16."""
    kind = ["white", "pink", "brown"][rng.integers(3)]
    if label == 0:  # at least ~3 LSB of noise: an all-zero clip's log-mel is far outside speech
        y = noise(rng, kind) * 10 ** (rng.uniform(-4, -3.5) if rng.random() < 0.1 else rng.uniform(-3.5, -1.5))
    else:
        while True:
            voice = f"{VOICES[rng.integers(len(VOICES))]}+{variants[rng.integers(len(variants))]}"
            speed, pitch, amp = (int(rng.integers(lo, hi)) for lo, hi in ((110, 201), (25, 76), (60, 181)))
            x = say(word, voice, speed, pitch, amp, tmp)
            if 0 < len(x) <= 0.95 * SR:
                break
        x = x / np.abs(x).max() * rng.uniform(0.1, 0.9)
        at = int(rng.integers(0, SR - len(x) + 1))
        y = np.zeros(SR)
        y[at:at + len(x)] = x
        y += noise(rng, kind) * np.sqrt(np.mean(x ** 2) / 10 ** (rng.uniform(10, 40) / 10))
    return np.round(np.clip(y, -1.0, 32767 / 32768) * 32768).astype(np.int16)


def wav_bytes(x: np.ndarray) -> bytes:
    from scipy.io import wavfile

    buf = io.BytesIO()
    wavfile.write(buf, SR, x)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("graph", type=Path, help="a frozen ML-KWS-for-MCU graph (its MFCC front end is read)")
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(args.graph.read_bytes())
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    session = tf.compat.v1.Session(graph=graph)
    mfcc = graph.get_tensor_by_name("Reshape_1:0")
    args.out.mkdir(parents=True, exist_ok=True)
    for (name, variants) in zip(("calib", "test"), split_variants()):
        rng = np.random.default_rng(SEEDS[name])
        jobs = [(label, "" if label == 0 else UNKNOWN[k % len(UNKNOWN)] if label == 1 else LABELS[label])
                for label in range(len(LABELS)) for k in range(PER_CLASS[name])]
        jobs = [jobs[i] for i in rng.permutation(len(jobs))]
        with tempfile.TemporaryDirectory() as d:
            waves = (wav_bytes(clip(rng, label, word, variants, Path(d) / "w.wav")) for label, word in jobs)
            feats = [session.run(mfcc, {"wav_data:0": w})[0] for w in waves]
        np.save(args.out / f"{name}.npy", np.stack(feats).astype(np.float32))
        np.save(args.out / f"{name}_labels.npy", np.array([label for label, _ in jobs], np.int64))
        print(f"{name}: {len(jobs)} clips", flush=True)


if __name__ == "__main__":
    main()
