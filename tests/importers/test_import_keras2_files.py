"""Keras 2 `.h5` files as TensorFlow 2.15 users save them (tests/golden/make_keras2.py: compiled
with a custom loss, trained, `model.save("m.h5")`). Keras 2 writes `time_major: false` into every
RNN's config, which Keras 3 refuses: the check's copy leaves it out, and qtool's float model equals
TensorFlow's own output on held-out inputs."""

from pathlib import Path

import numpy as np
import pytest
from conftest import has

import qtool
import qtool.layers as L
from qtool.importers.keras.copy import inference_config

GOLDEN = Path(__file__).parent.parent / "golden"
FILES = ("keras2_seq", "keras2_bidi_hs")


@pytest.mark.parametrize("name", FILES)
def test_a_keras2_file_computes_what_tensorflow_computed(name):
    g = qtool.load_model(GOLDEN / f"{name}.h5", check=False)
    io = np.load(GOLDEN / f"{name}_io.npz")
    got = L.run(g, io["x"])[g.outputs[0]]
    assert got.shape == io["y"].shape and np.abs(got - io["y"]).max() <= 1e-5


@pytest.mark.skipif(not has("keras"), reason="the check runs Keras")
@pytest.mark.parametrize("name", FILES)
def test_keras_3_checks_a_keras2_file(name, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    g = qtool.load_model(GOLDEN / f"{name}.h5", check=True)
    assert g.check_result["checked"] and g.check_result["max_abs_diff"] < 1e-5


def test_only_keras2s_default_time_major_is_left_out():
    config = {"class_name": "GRU", "config": {"time_major": False, "units": 4},
              "layers": [{"config": {"time_major": True}}]}
    assert inference_config(config) == {"class_name": "GRU", "config": {"units": 4},
                                        "layers": [{"config": {"time_major": True}}]}
