"""Accuracy of the integer GRU on the bundled sample's held-out test split."""

import numpy as np
import pytest
from conftest import SAMPLES, has

pytestmark = pytest.mark.skipif(not has("safetensors"), reason="the sample is .safetensors")


@pytest.fixture(scope="module")
def results():
    import sys

    sys.path.insert(0, str(SAMPLES))
    from evaluate import evaluate

    return {r["preset"]: r for r in evaluate()}


def test_int16_cosine(results):
    assert results["int16 auto"]["cosine"] >= 0.9999


def test_w8a16_cosine(results):
    assert results["w8a16 auto"]["cosine"] >= 0.9995


def test_int8_cosine_and_task_accuracy(results):
    assert results["float"]["accuracy"] > 0.95
    for run, r in results.items():  # every preset, and int8 with every calibration method
        if run != "float":
            assert r["cosine"] >= 0.99, run
            assert abs(r["accuracy"] - results["float"]["accuracy"]) <= 0.01, run


def test_sample_data_is_disjoint():
    calib, test = np.load(SAMPLES / "calib.npy"), np.load(SAMPLES / "test.npy")
    calib_rows = {c.tobytes() for c in calib}
    assert sum(t.tobytes() in calib_rows for t in test) <= 2  # digits has a few exact duplicates
