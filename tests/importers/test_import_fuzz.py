"""Fuzzing the importers: mutated framework files (bytes flipped, cut, zeroed; Keras configs and ONNX
graphs with values of the wrong type or size) must import or be refused with one QtoolError line;
never another exception, never a traceback.

Legacy Keras .h5 files are left out of the byte mutations: libhdf5 can loop forever on a corrupt
global heap (h5py issue 2088, a libhdf5 bug); .keras archives are protected by the zip CRC.
"""

import json
import random
import zipfile

import numpy as np
import pytest
from conftest import GOLDEN, has

from qtool.errors import QtoolError
from qtool.importers import import_model

BYTE_CASES = 40  # per file; a few seconds in all
FILES = [f for f, mod in (("torch_bidir.safetensors", "safetensors"), ("torch_bidir.pt", "torch"),
                          ("keras_stack.keras", "h5py"), ("onnx_bidir.onnx", "onnx")) if has(mod)]
ODD_VALUES = [None, -1, 0, 10**12, 1.5, "relu", "", [], [1, 2], {}, {"a": 1}, True]


def imports_or_refuses(path, **kw) -> None:
    try:
        import_model(path, **kw)
    except QtoolError as e:
        assert "\n" not in str(e)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    d = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            d[rng.randrange(len(d))] = rng.randrange(256)
    elif kind == 1:
        d = d[:rng.randrange(len(d))]
    elif kind == 2:
        a = rng.randrange(len(d))
        d[a:a + 8] = rng.randbytes(8)
    else:
        a = rng.randrange(len(d))
        d[a:a + 64] = bytes(len(d[a:a + 64]))
    return bytes(d)


def haste_file(tmp_path):
    rng = np.random.RandomState(0)
    np.savez(tmp_path / "h.npz", kernel=rng.randn(3, 12), recurrent_kernel=rng.randn(4, 12),
             bias=rng.randn(12), recurrent_bias=rng.randn(12))
    return tmp_path / "h.npz"


@pytest.mark.parametrize("name", FILES + ["haste.npz"])
def test_mutated_bytes(tmp_path, name):
    src = haste_file(tmp_path) if name == "haste.npz" else GOLDEN / name
    data, rng = src.read_bytes(), random.Random(name)
    for i in range(BYTE_CASES):
        path = tmp_path / f"{i}{src.suffix}"
        path.write_bytes(mutate_bytes(data, rng))
        imports_or_refuses(path, check=False)


def walk(obj, path=()):
    """Every (path, value) in a JSON tree."""
    yield path, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from walk(v, path + (k,))


def test_mutated_keras_configs(tmp_path):
    with zipfile.ZipFile(GOLDEN / "keras_stack.keras") as z:
        files = {n: z.read(n) for n in z.namelist()}
    config = json.loads(files["config.json"])
    paths = [p for p, _ in walk(config) if p]
    rng = random.Random(1)
    for i in range(60):
        mutated = json.loads(files["config.json"])
        for _ in range(rng.randint(1, 3)):
            *parent, key = rng.choice(paths)
            try:
                target = mutated
                for k in parent:
                    target = target[k]
                target[key] = rng.choice(ODD_VALUES)
            except (KeyError, IndexError, TypeError):
                pass  # an earlier mutation removed this path
        path = tmp_path / f"{i}.keras"
        with zipfile.ZipFile(path, "w") as z:
            for n, data in files.items():
                z.writestr(n, json.dumps(mutated) if n == "config.json" else data)
        imports_or_refuses(path, check=False)


@pytest.mark.skipif(not has("onnx"), reason="onnx not installed")
def test_mutated_onnx_graphs(tmp_path):
    import onnx
    from onnx import helper

    rng = random.Random(2)
    for i in range(60):
        m = onnx.load(GOLDEN / "onnx_bidir.onnx")
        node, inits = m.graph.node[0], m.graph.initializer
        kind = rng.randrange(6)
        if kind == 0:  # an attribute of the wrong type or value
            name = rng.choice(["hidden_size", "direction", "activations", "clip", "layout", "linear_before_reset"])
            value = rng.choice([0, -3, 10**10, 1.0, "reverse", "x", [1, 2], ["Tanh"], ["Sigmoid", "Tanh"] * 2])
            kept = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend(kept + [helper.make_attribute(name, value)])
        elif kind == 1:  # an input renamed, removed or pointing at the node's own output
            k = rng.randrange(len(node.input))
            node.input[k] = rng.choice(["", "nope", node.output[0], "X"])
        elif kind == 2:  # declared dims that disagree with the data
            t = rng.choice(inits)
            dims = list(t.dims)
            dims[rng.randrange(len(dims))] = rng.choice([0, 1, 2, 3 * 10**9, -1])
            del t.dims[:]
            t.dims.extend(dims)
        elif kind == 3:  # another element type
            rng.choice(inits).data_type = rng.choice([2, 3, 6, 7, 9, 10, 14, 16, 99])
        elif kind == 4:  # the payload cut
            t = rng.choice(inits)
            t.raw_data = t.raw_data[:rng.randrange(len(t.raw_data) + 1)]
        else:  # a second GRU node fed by the first, with arbitrary glue
            glue = helper.make_node(rng.choice(["Transpose", "Squeeze", "Reshape", "Identity"]), ["Y"], ["Z"])
            node2 = helper.make_node("GRU", ["Z", "W", "R", "B"], ["Y2"], name="second", hidden_size=9,
                                     direction="bidirectional", linear_before_reset=1)
            m.graph.node.extend([glue, node2])
        path = tmp_path / f"{i}.onnx"
        onnx.save(m, path)
        imports_or_refuses(path, check=has("onnxruntime"))
