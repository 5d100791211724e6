"""The C export of whole models against the simulator: graphs that use every op the C export
knows (causal ones that stream, and ones that only run whole), calibrated on random data with
each preset, exported, compiled warning-free (gcc, clang, the emulated Cortex-M4) and run on
held-out sequences: every edge's integers, the dequantized output, and the frames NAME_step
gives one input frame at a time must equal the simulator's exactly."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from qtool.exporters.c_export import footprint
from qtool.exporters.c_graph import input_arrays, render_graph_c
from qtool.exporters.c_graph_verify import compare_graph, run_graph_c
from qtool.exporters.c_target import missing_tools

from qtool import api
from qtool.core.graph import Graph, Node
from qtool.errors import QtoolError
from qtool.graph.simulate import run_int
from qtool.numerics.qparams import dequantize

HAVE_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")


def _w(rng, *shape, scale=0.5):
    return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1] if len(shape) > 1 else 1)).astype(np.float32)


def _gru(rng, name, inp, out, C, H, bidirectional=False, return_sequences=True, layers=1):
    params, D = {}, 2 if bidirectional else 1
    for k in range(layers):
        c = C if k == 0 else H * D
        for d in ("fwd", "bwd")[:D]:
            params.update({f"l{k}.{d}.W": _w(rng, 3 * H, c), f"l{k}.{d}.R": _w(rng, 3 * H, H),
                           f"l{k}.{d}.bx": _w(rng, 3 * H, scale=0.1), f"l{k}.{d}.br": _w(rng, 3 * H, scale=0.1)})
    return Node(name, "gru", [inp], [out], {"layers": layers, "bidirectional": bidirectional,
                                           "return_sequences": return_sequences}, params)


def causal_graph(seed=0) -> Graph:
    """Streams: causal and strided windows, GRU, gates, a skip, concat, pools, a float tail."""
    rng = np.random.RandomState(seed)
    n = [
        Node("conv", "conv1d", ["x"], ["c1"], {"kernel": 3, "dilation": 2, "padding": "causal"},
             {"W": _w(rng, 8, 6, 3), "b": _w(rng, 8, scale=0.1)}),
        Node("bn", "batchnorm", ["c1"], ["b1"], {"epsilon": 1e-3},
             {"gamma": 1 + _w(rng, 8, scale=0.1), "beta": _w(rng, 8, scale=0.1), "mean": _w(rng, 8, scale=0.1),
              "var": np.abs(1 + _w(rng, 8, scale=0.1))}),
        Node("relu", "activation", ["b1"], ["r1"], {"kind": "relu"}),
        Node("dw", "conv1d", ["r1"], ["c2"], {"kernel": 2, "groups": 8, "padding": (1, 0)}, {"W": _w(rng, 8, 1, 2)}),
        Node("pool", "avg_pool1d", ["c2"], ["p1"], {"pool": 2, "stride": 2}),
        _gru(rng, "gru", "p1", "h", 8, 12),
        Node("gate_fc", "dense", ["h"], ["gl"], {}, {"W": _w(rng, 12, 12), "b": _w(rng, 12, scale=0.1)}),
        Node("gate", "activation", ["gl"], ["gs"], {"kind": "sigmoid"}),
        Node("gated", "mul", ["h", "gs"], ["m1"]),
        Node("skip", "add", ["m1", "h"], ["a1"]),
        Node("join", "concat", ["a1", "gl"], ["j1"]),
        Node("mpool", "max_pool1d", ["j1"], ["mp"], {"pool": 2, "stride": 1, "padding": (1, 0)}),
        Node("gpool", "global_avg_pool1d", ["mp"], ["g1"]),
        Node("head", "dense", ["g1"], ["logits"], {}, {"W": _w(rng, 5, 24), "b": _w(rng, 5, scale=0.1)}),
        Node("softmax", "softmax", ["logits"], ["y"]),
    ]
    return Graph(n, {"x": (None, 6)}, ["y"], name="causal")


def whole_graph(seed=1) -> Graph:
    """Runs whole only: 'same' and right padding, a bidirectional GRU's final states."""
    rng = np.random.RandomState(seed)
    n = [
        Node("pad", "zero_pad1d", ["x"], ["z"], {"pad": (1, 2)}),
        Node("conv", "conv1d", ["z"], ["c1"], {"kernel": 3, "stride": 2, "padding": "same", "groups": 2},
             {"W": _w(rng, 10, 2, 3)}),
        Node("act", "activation", ["c1"], ["a1"], {"kind": "leaky_relu", "alpha": 0.1}),
        Node("bn", "batchnorm", ["a1"], ["b1"], {"epsilon": 1e-5},
             {"gamma": 1 + _w(rng, 10, scale=0.2), "beta": _w(rng, 10, scale=0.2), "mean": _w(rng, 10, scale=0.2),
              "var": np.abs(1 + _w(rng, 10, scale=0.2))}),
        Node("pool", "avg_pool1d", ["b1"], ["p1"], {"pool": 3, "stride": 1, "padding": "same"}),
        _gru(rng, "gru", "p1", "hs", 10, 8, bidirectional=True, layers=2),
        Node("fc", "dense", ["hs"], ["f1"], {}, {"W": _w(rng, 6, 16)}),
        Node("tanh", "activation", ["f1"], ["t1"], {"kind": "tanh"}),
        Node("last", "last_step", ["t1"], ["l1"]),
        Node("gmax", "global_max_pool1d", ["hs"], ["g1"]),
        Node("cat", "concat", ["l1", "g1"], ["cat"]),
        Node("norm", "l2_normalize", ["cat"], ["y"]),
    ]
    return Graph(n, {"x": (None, 4)}, ["y"], name="whole")


def padded_graph(seed=3) -> Graph:
    """Streams with padding after the end: NAME_finish pushes it. 'same' convolution (stride 1),
    ZeroPadding1D before an average pool (the Keras model's), explicit right padding."""
    rng = np.random.RandomState(seed)
    n = [
        Node("conv", "conv1d", ["x"], ["c1"], {"kernel": 3, "padding": "same"}, {"W": _w(rng, 6, 4, 3)}),
        Node("pad", "zero_pad1d", ["c1"], ["z"], {"pad": (1, 1)}),
        Node("pool", "avg_pool1d", ["z"], ["p1"], {"pool": 2}),
        _gru(rng, "gru", "p1", "h", 6, 8),
        Node("conv2", "conv1d", ["h"], ["c2"], {"kernel": 3, "padding": (1, 2)}, {"W": _w(rng, 4, 8, 3)}),
        Node("pool2", "max_pool1d", ["c2"], ["y"], {"pool": 2, "stride": 1, "padding": (1, 0)}),
    ]
    return Graph(n, {"x": (None, 4)}, ["y"], name="padded")


def final_state_graph(seed=2) -> Graph:
    rng = np.random.RandomState(seed)
    n = [Node("fc", "dense", ["x"], ["f"], {}, {"W": _w(rng, 8, 5), "b": _w(rng, 8, scale=0.1)}),
         _gru(rng, "gru", "f", "h", 8, 10, return_sequences=False),
         Node("out", "dense", ["h"], ["y"], {}, {"W": _w(rng, 3, 10)})]
    return Graph(n, {"x": (None, 5)}, ["y"], name="final")


def _data(C, n, T, seed):
    return np.random.RandomState(seed).standard_normal((n, T, C)).astype(np.float32)


def _verify(qg, x, tmp_path, target="host", name="m"):
    ex = render_graph_c(qg, name)
    for f, b in ex.encoded().items():
        (tmp_path / f).write_bytes(b)
    c = run_graph_c(ex.layout, tmp_path, ex.prefix, input_arrays(qg, x), target)
    q = run_int(qg, x)
    out = qg.core_outputs[0]
    y = dequantize(q[out], int(qg.grids[out].exp2_inv), qg.grids[out].zp).astype(np.float32)
    return compare_graph(c, q, out, y), ex


GRAPHS = {"causal": (causal_graph, 6), "whole": (whole_graph, 4), "final": (final_state_graph, 5),
          "padded": (padded_graph, 4)}


@needs_cc
@pytest.mark.parametrize("bits", ["int8", "w8a16", "int16"])
@pytest.mark.parametrize("which", list(GRAPHS))
def test_whole_model_c_equals_simulator(which, bits, tmp_path):
    make, C = GRAPHS[which]
    qg = api.calibrate(make(), _data(C, 64, 24, 0), bits=bits, method="minmax", check=False)
    res, ex = _verify(qg, _data(C, 6, 21, 1) * 1.3, tmp_path)  # held out, some values beyond the range
    assert res["edge_mismatches"] == 0, {e: v for e, v in res["edges"].items() if v}
    assert res["dequantized_mismatches"] == 0
    assert res["edge_values"] > 0
    assert res["streaming"] == (which != "whole")
    if res["streaming"]:
        assert res["stream_values"] > 0 and res["stream_mismatches"] == 0
    else:
        assert "bidirectional" in ex.footprint.streaming_refusal or "pads" in ex.footprint.streaming_refusal


@needs_cc
@pytest.mark.skipif(bool(missing_tools()), reason="no Cortex-M toolchain or QEMU")
@pytest.mark.parametrize("which,bits", [(g, "int8") for g in GRAPHS] + [("causal", "w8a16"), ("whole", "int16")])
def test_whole_model_c_on_cortex_m4(which, bits, tmp_path):
    make, C = GRAPHS[which]
    qg = api.calibrate(make(), _data(C, 64, 24, 0), bits=bits, method="minmax", check=False)
    res, _ = _verify(qg, _data(C, 3, 17, 2), tmp_path, target="cortex-m4")
    assert res["edge_mismatches"] == 0 and res["dequantized_mismatches"] == 0 and res["stream_mismatches"] == 0


def test_short_sequences_are_refused_by_the_c(tmp_path):
    """A sequence shorter than a window (after padding) has no output: run_sequence returns -1."""
    if not HAVE_CC:
        pytest.skip("no C compiler")
    g = Graph([Node("conv", "conv1d", ["x"], ["y"], {"kernel": 5}, {"W": _w(np.random.RandomState(0), 3, 2, 5)})],
              {"x": (None, 2)}, ["y"])
    qg = api.calibrate(g, _data(2, 16, 12, 0), method="minmax", check=False)
    with pytest.raises(QtoolError, match="too short or too long"):
        _verify(qg, _data(2, 2, 3, 1), tmp_path)


@needs_cc
def test_cli_exports_and_verifies_a_whole_model(cli, tmp_path):
    """As a user runs it: `export c` on the quantized whole-model file (per-layer footprint,
    test vectors whose own main passes), `verify` PASS; a tampered export fails; another model's
    export is refused in one line."""
    import json
    import subprocess

    qg = api.calibrate(causal_graph(), _data(6, 48, 20, 0), method="minmax", check=False)
    api.save(qg, tmp_path / "q.h5")
    np.save(tmp_path / "test.npy", _data(6, 5, 13, 3))
    code, out, err = cli("export", "c", tmp_path / "q.h5", "-o", tmp_path / "c", "--name", "kws", "--test-vectors")
    assert code == 0, err
    assert "footprint by layer" in out and "kws_step runs one frame at a time" in out
    code, out, err = cli("export", "c", tmp_path / "q.h5", "-o", tmp_path / "c", "--name", "kws", "--json", "--force",
                         "--test-vectors")
    doc = json.loads(out)
    assert doc["streaming"] and [x["op"] for x in doc["layers"]][:3] == ["conv1d", "activation", "conv1d"]  # bn folded
    assert doc["flash_bytes"] == sum(x["flash_bytes"] for x in doc["layers"]) > 0
    exe = tmp_path / "t"
    srcs = [str(p) for p in (tmp_path / "c").glob("*.c")]
    subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{tmp_path / 'c'}",
                    *srcs, "-o", str(exe), "-lm"], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("PASS: 0 mismatches"), run.stdout
    code, out, err = cli("verify", tmp_path / "q.h5", tmp_path / "c", tmp_path / "test.npy")
    assert code == 0 and "PASS" in out and "frame by frame (kws_step): 0 mismatches" in out, (out, err)
    # the head's weights negated in the export: verify finds the layer
    params = (tmp_path / "c" / "kws_params.c").read_text()
    start = params.index("{", params.index("kws_head_W[")) + 1
    end = params.index("}", start)
    negated = ", ".join(str(-int(v)) for v in params[start:end].replace("\n", " ").split(","))
    (tmp_path / "c" / "kws_params.c").write_text(params[:start] + negated + params[end:])
    code, out, err = cli("verify", tmp_path / "q.h5", tmp_path / "c", tmp_path / "test.npy", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["edges"]["logits"] > 0 and doc["edges"]["mp"] == 0 and doc["passed"] is False
    # another model's export
    other = api.calibrate(final_state_graph(), _data(5, 32, 20, 0), method="minmax", check=False)
    api.save(other, tmp_path / "other.h5")
    code, out, err = cli("verify", tmp_path / "other.h5", tmp_path / "c", tmp_path / "test.npy")
    assert code != 0 and "made from another model" in err and "Traceback" not in err


@pytest.mark.parametrize("bits", ["int8", "w8a16", "int16"])
@pytest.mark.parametrize("which", list(GRAPHS))
def test_advise_counts_flash_as_the_export_does(which, bits):
    """`advise --max-flash` says "as qtool export c counts them": layer for layer the same bytes."""
    from qtool.advisor.graph import graph_flash

    make, C = GRAPHS[which]
    qg = api.calibrate(make(), _data(C, 32, 24, 0), bits=bits, method="minmax", check=False)
    assert graph_flash(qg) == render_graph_c(qg, "m").footprint.flash_bytes


@needs_cc
@pytest.mark.parametrize("which", list(GRAPHS))
def test_the_work_buffer_has_a_compile_time_size(which, tmp_path):
    """NAME_SEQUENCE_WORK_MAX(T), a constant expression in the header, is at least what
    NAME_sequence_work(T) returns at every length, so the work buffer can be allocated statically,
    and within an eighth of it (plus 1 KiB): strides and pools bound each edge's steps."""
    make, C = GRAPHS[which]
    qg = api.calibrate(make(), _data(C, 16, 24, 0), bits="w8a16", method="minmax", check=False)
    ex = render_graph_c(qg, "m")
    for n, data in ex.encoded().items():
        (tmp_path / n).write_bytes(data)
    (tmp_path / "main.c").write_text('''#include <stdio.h>
#include "m.h"
static uint32_t work[(M_SEQUENCE_WORK_MAX(40) + 3) / 4]; /* a constant expression */
int main(void)
{
    int32_t T, checked = 0;
    (void)work;
    for (T = 1; T <= 400; T++) {
        int32_t need = m_sequence_work(T);
        if (need >= 0) {
            if (need > M_SEQUENCE_WORK_MAX(T)) {
                printf("T=%d: %d > %d\\n", (int)T, (int)need, (int)M_SEQUENCE_WORK_MAX(T));
                return 1;
            }
            if (T >= 16 && M_SEQUENCE_WORK_MAX(T) > need + need / 8 + 1024) { /* and not much more */
                printf("T=%d: %d is loose for %d\\n", (int)T, (int)M_SEQUENCE_WORK_MAX(T), (int)need);
                return 1;
            }
            checked++;
        }
    }
    printf("%d\\n", (int)checked);
    return 0;
}
''')
    cc = shutil.which("cc") or shutil.which("gcc")
    sources = [str(tmp_path / n) for n in ex.layout[3]] + [str(tmp_path / "main.c")]
    subprocess.run([cc, "-std=c99", "-O1", "-o", str(tmp_path / "t"), *sources, "-lm"], check=True, cwd=tmp_path)
    done = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True)
    assert done.returncode == 0 and int(done.stdout) > 300, done.stdout


def test_each_layer_counts_its_macs_at_its_own_rate():
    """After a stride of 2 every layer runs every other input frame; after the last step or a
    global pool, once per sequence: the footprint's MACs per frame and per sequence say so."""
    qg = api.calibrate(whole_graph(), _data(4, 16, 24, 0), method="minmax", check=False)
    layers = {x.name: x for x in render_graph_c(qg, "m").footprint.layers}
    gru = qg.qparams["gru"]["qm"].model
    per_step = sum(c.W.shape[0] * (c.W.shape[1] + c.R.shape[1]) for cells in gru.layers for c in cells)
    assert layers["gru"].macs_per_frame == per_step / 2 and layers["gru"].macs_per_sequence == 0
    assert layers["conv"].macs_per_frame == 10 * 2 * 3 / 2  # 10 outputs of 2 inputs x 3 taps, every other frame
    assert layers["fc"].macs_per_frame == 6 * 16 / 2
    assert layers["cat"].macs_per_sequence == layers["cat"].macs_per_frame == 0  # concatenates two vectors


@needs_cc
def test_compensation_offset_drops_the_grus_tables_and_keeps_the_integers(tmp_path):
    """A whole model's GRUs take --compensation offset as a GRU alone does: less flash, the same
    integers (verify against the simulator)."""
    make, C = GRAPHS["causal"]
    qg = api.calibrate(make(), _data(C, 16, 24, 0), method="minmax", check=False)
    table = api.export_c(qg, tmp_path / "t", name="m")
    offset = api.export_c(qg, tmp_path / "o", name="m", compensation="offset")
    gru_saves = sum(footprint(qg.qparams[g]["qm"]).offset_saves for g in qg.grus)
    assert gru_saves > 0 and offset.footprint.flash_bytes == table.footprint.flash_bytes - gru_saves
    assert offset.compensation == "offset"
    assert api.verify(qg, tmp_path / "o", _data(C, 6, 11, 3)).mismatches == 0


def several_outputs_graph(seed=3) -> Graph:
    """As RNNoise is exported: per-frame gains (a sigmoid head), a voice-activity vector, and the GRU's
    final state, three outputs of three grids."""
    rng = np.random.RandomState(seed)
    n = [
        Node("fc", "dense", ["x"], ["f1"], {}, {"W": _w(rng, 8, 6), "b": _w(rng, 8, scale=0.1)}),
        Node("tanh", "activation", ["f1"], ["t1"], {"kind": "tanh"}),
        _gru(rng, "gru", "t1", "h", 8, 10),
        Node("gain_fc", "dense", ["h"], ["gl"], {}, {"W": _w(rng, 4, 10), "b": _w(rng, 4, scale=0.1)}),
        Node("gains", "activation", ["gl"], ["gains"], {"kind": "sigmoid"}),
        Node("last", "last_step", ["h"], ["state"]),
        Node("vad_fc", "dense", ["state"], ["vad"], {}, {"W": _w(rng, 1, 10)}),
    ]
    return Graph(n, {"x": (None, 6)}, ["gains", "vad", "state"], name="denoise")


@needs_cc
def test_a_model_of_several_outputs_exports_each_and_verifies(tmp_path):
    """Every output is exported with its own grid: the first through NAME_run_sequence's y_q, the
    others by NAME_outputK (in the work buffer after a run) and NAME_latestK (streaming); verify
    compares every edge; a C main reads each output and gets the simulator's integers."""
    from qtool.numerics.qparams import quantize

    qg = api.calibrate(several_outputs_graph(), _data(6, 24, 20, 0), method="minmax", check=False)
    assert qg.core_outputs == ["gains", "vad", "state"]
    res = api.export_c(qg, tmp_path, name="dn")
    header = (tmp_path / "dn.h").read_text()
    assert "#define DN_OUTPUT1_SIZE (1)" in header and "#define DN_OUTPUT2_SIZE (10)" in header
    assert "dn_latest2(const dn_state_t *s)" in header and res.footprint.streaming
    x = _data(6, 5, 13, 7)
    assert api.verify(qg, tmp_path, x).mismatches == 0
    q = run_int(qg, x[:1])
    g = qg.grids["x"]
    xq = quantize(x[:1], int(g.exp2_inv), g.zp, g.bits).reshape(-1)
    (tmp_path / "main.c").write_text(f'''#include <stdio.h>
#include "dn.h"
static const dn_in_t x_q[] = {{{", ".join(str(int(v)) for v in xq)}}};
static uint32_t work[(DN_SEQUENCE_WORK_MAX(13) + 3) / 4];
static dn_out_t y_q[13 * DN_OUTPUT_SIZE];
int main(void)
{{
    static dn_state_t s;
    int32_t k, t, steps1, steps2, frames = 0;
    const dn_out1_t *vad;
    const dn_out2_t *state;
    t = dn_run_sequence(&s, x_q, 13, y_q, work);
    vad = dn_output1(work, 13, &steps1);
    state = dn_output2(work, 13, &steps2);
    printf("%d %d %d\\n", (int)t, (int)steps1, (int)steps2);
    for (k = 0; k < DN_OUTPUT1_SIZE; k++) printf("%d ", (int)vad[k]);
    printf("\\n");
    for (k = 0; k < DN_OUTPUT2_SIZE; k++) printf("%d ", (int)state[k]);
    printf("\\n");
    dn_reset(&s);
    for (t = 0; t < 13; t++) frames += dn_step(&s, x_q + t * DN_INPUT_SIZE, y_q);
    for (k = 0; k < DN_OUTPUT2_SIZE; k++) printf("%d ", (int)dn_latest2(&s)[k]);
    printf("\\n%d\\n", (int)frames);
    return 0;
}}
''')
    cc = shutil.which("cc") or shutil.which("gcc")
    sources = [str(p) for p in tmp_path.glob("*.c")]
    subprocess.run([cc, "-std=c99", "-O1", "-o", str(tmp_path / "t"), *sources, "-lm"], check=True, cwd=tmp_path)
    lines = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True).stdout.splitlines()
    assert lines[0].split() == ["13", "1", "1"] and lines[-1] == "13"
    assert [int(v) for v in lines[1].split()] == q["vad"].reshape(-1).tolist()
    assert [int(v) for v in lines[2].split()] == q["state"].reshape(-1).tolist()
    assert [int(v) for v in lines[3].split()] == q["state"].reshape(-1).tolist()  # the stream's last state


def test_a_float_tail_after_another_output_than_the_first_is_refused():
    g = several_outputs_graph()
    g.nodes += [Node("sm", "softmax", ["state"], ["probs"]), Node("norm", "l2_normalize", ["gl"], ["unit"])]
    g.outputs = ["probs", "unit"]
    qg = api.calibrate(g, _data(6, 24, 20, 0), method="minmax", check=False)
    with pytest.raises(QtoolError, match="runs a float tail after the first output"):
        render_graph_c(qg, "m")


@pytest.mark.parametrize("which", list(GRAPHS))
def test_edge_layout_writes_within_its_layout_size(which, tmp_path):
    """NAME_edge_layout fills NAME_LAYOUT_SIZE entries of each array (the edges, then each GRU's
    own work) and not one more: a caller sizing them so (the verify program, NAME_run_sequence)
    keeps its stack whole."""
    make, C = GRAPHS[which]
    qg = api.calibrate(make(), _data(C, 16, 24, 0), bits="int8", method="minmax", check=False)
    ex = render_graph_c(qg, "m")
    for n, data in ex.encoded().items():
        (tmp_path / n).write_bytes(data)
    (tmp_path / "main.c").write_text('''#include <stdio.h>
#include "m.h"
int main(void)
{
    int32_t steps[M_LAYOUT_SIZE + 8], offset[M_LAYOUT_SIZE + 8], i;
    for (i = 0; i < M_LAYOUT_SIZE + 8; i++) {
        steps[i] = offset[i] = -12345;
    }
    if (m_edge_layout(40, steps, offset) < 0) {
        return 2;
    }
    for (i = M_LAYOUT_SIZE; i < M_LAYOUT_SIZE + 8; i++) {
        if (steps[i] != -12345 || offset[i] != -12345) {
            return 1;
        }
    }
    printf("%d\\n", (int)(M_LAYOUT_SIZE - M_NUM_EDGES));
    return 0;
}
''')
    cc = shutil.which("cc") or shutil.which("gcc")
    sources = [str(tmp_path / n) for n in ex.layout[3]] + [str(tmp_path / "main.c")]
    subprocess.run([cc, "-std=c99", "-O1", "-o", str(tmp_path / "t"), *sources, "-lm"], check=True, cwd=tmp_path)
    done = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True)
    assert done.returncode == 0 and int(done.stdout) == len(qg.core), done.stdout


@needs_cc
def test_a_whole_model_that_is_a_gru_alone_exports_the_grus_own_c(tmp_path):
    """A quantized whole model of one gru node from its input to its output (a GRU's weights read
    with whole=True) is exported as the GRU it is: the same files, byte for byte, as the GRU
    alone calibrated alike, and `verify` of the whole model checks them with 0 mismatches."""
    from conftest import SAMPLES

    import qtool

    src, calib = SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy"
    qg = qtool.calibrate(qtool.load_model(src, whole=True), calib, method="minmax", limit=40)
    qm = qtool.calibrate(src, calib, method="minmax", limit=40)
    assert isinstance(qg, api.QGraph) and len(qg.graph.nodes) == 1
    qtool.save(qg, tmp_path / "qg.h5")
    whole = qtool.export_c(tmp_path / "qg.h5", tmp_path / "g", name="digits", test_vectors=np.load(calib)[:2])
    alone = qtool.export_c(qm, tmp_path / "a", name="digits", test_vectors=np.load(calib)[:2])
    assert sorted(whole.files) == sorted(alone.files) and "digits.h" in whole.files
    assert all((tmp_path / "g" / f).read_bytes() == (tmp_path / "a" / f).read_bytes() for f in whole.files)
    assert whole.fingerprint == qm.fingerprint()
    res = qtool.verify(qg, tmp_path / "g", SAMPLES / "test.npy", limit=5)
    assert res.mismatches == 0 and res.output_values > 0


def rates_graph(seed=6) -> Graph:
    """Three outputs at three rates: every frame, every other frame (a stride of 2), and every
    frame two frames late (right padding: its last two come from NAME_flush)."""
    rng = np.random.RandomState(seed)
    n = [Node("fc", "dense", ["x"], ["y"], {}, {"W": _w(rng, 3, 4)}),
         Node("half", "conv1d", ["x"], ["h2"], {"kernel": 2, "stride": 2}, {"W": _w(rng, 5, 4, 2)}),
         Node("late", "conv1d", ["x"], ["l"], {"kernel": 3, "padding": (0, 2)}, {"W": _w(rng, 2, 4, 3)})]
    return Graph(n, {"x": (None, 4)}, ["y", "h2", "l"], name="rates")


@needs_cc
def test_every_output_is_verified_frame_by_frame_at_its_own_rate(tmp_path):
    """NAME_framesK counts output K's frames (a stride's every other, a right padding's from
    NAME_flush, one a call); verify compares each frame NAME_latestK shows when its count moves,
    and the final count, so a wrong or lost frame of any output is found frame by frame."""
    qg = api.calibrate(rates_graph(), _data(4, 24, 20, 0), method="minmax", check=False)
    x = _data(4, 3, 11, 1)
    res, ex = _verify(qg, x, tmp_path)
    q = run_int(qg, x)
    assert res["stream_mismatches"] == 0 and res["edge_mismatches"] == 0
    seen = 3 * (11 * 3 + 5 * 5 + 11 * 2)  # every frame of y and h2 (5), l's 9 from steps and 2 from NAME_flush
    assert q["h2"].shape[1] == 5 and q["l"].shape[1] == 11 and res["stream_values"] == seen
    header = (tmp_path / "m.h").read_text()
    assert "int32_t m_frames1(const m_state_t *s);" in header and "int32_t m_frames2(" in header
    # a frame of the strided output that only NAME_step computes wrongly: whole sequences still agree
    source = (tmp_path / "m.c").read_text()
    flip = f"s->frames1++;\n        s->e{ex.edges.index('h2')}[0] ^= 1;"
    (tmp_path / "m.c").write_text(source.replace("s->frames1++;", flip))
    c = run_graph_c(ex.layout, tmp_path, ex.prefix, [x], "host")
    out = qg.core_outputs[0]
    res = compare_graph(c, q, out, dequantize(q[out], int(qg.grids[out].exp2_inv), qg.grids[out].zp))
    assert res["edge_mismatches"] == 0 and res["stream_mismatches"] == 3 * 5


@needs_cc
def test_test_vectors_check_every_output_whole_and_frame_by_frame(tmp_path):
    """`--test-vectors` of a model of three outputs at three rates: its own main checks each
    output after NAME_run_sequence and each frame NAME_latestK shows while streaming, the last two
    of the late output from NAME_flush; a wrong expected value of output 2 fails it, and so does a
    stream that does not end."""
    import subprocess

    qg = api.calibrate(rates_graph(), _data(4, 24, 20, 0), method="minmax", check=False)
    x = _data(4, 3, 11, 1)
    api.export_c(qg, tmp_path / "c", name="r", test_vectors=x)
    q = run_int(qg, x)
    header = (tmp_path / "c" / "r_test_vectors.h").read_text()
    assert "#define R_TEST_OUTPUT1_VALUES 25" in header and "#define R_TEST_OUTPUT2_VALUES 22" in header

    def run() -> str:
        srcs = [str(p) for p in (tmp_path / "c").glob("*.c")]
        subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{tmp_path / 'c'}",
                        *srcs, "-o", str(tmp_path / "t"), "-lm"], check=True)
        return subprocess.run([str(tmp_path / "t")], capture_output=True, text=True).stdout

    whole = sum(int(np.size(q[e])) for e in ("y", "h2", "l"))
    assert run() == f"PASS: 0 mismatches in {2 * whole} output integers\n"
    # the late output's last frame (one NAME_flush gives) expected otherwise: found whole and streaming
    at = header.index("r_test_expected2[")
    end = header.index("};", at)
    values = header[header.index("{", at) + 1:end].replace("\n", " ").split(",")
    values[21] = str(int(values[21]) ^ 1)
    (tmp_path / "c" / "r_test_vectors.h").write_text(header[:header.index("{", at) + 1] + ",".join(values)
                                                     + header[end:])
    assert run().startswith("FAIL: 2 mismatches")
    # a NAME_flush that says -1 only a thousand calls late: every frame right, the stream's end not
    (tmp_path / "c" / "r_test_vectors.h").write_text(header)
    source = (tmp_path / "c" / "r.c").read_text()
    end = "    } else {\n        return -1;\n    }\n"
    assert source.count(end) == 1
    late = end.replace("return -1;", "return s->flushed++ < 1000 ? 0 : -1;")
    (tmp_path / "c" / "r.c").write_text(source.replace(end, late))
    assert run().startswith("FAIL: 3 mismatches")  # one per sequence


@pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("g++")), reason="needs gcc and g++")
def test_a_cpp_program_links_the_exported_c(tmp_path):
    """The headers declare C linkage for C++: a C++ main calls a whole model's and a GRU alone's
    C, compiled by a C compiler, and gets the simulator's integers."""
    from conftest import SAMPLES

    qg = api.calibrate(rates_graph(), _data(4, 24, 20, 0), method="minmax", check=False)
    gru = api.calibrate(SAMPLES / "digits_gru.safetensors", SAMPLES / "calib.npy", method="minmax")
    api.export_c(qg, tmp_path / "c", name="r")
    api.export_c(gru, tmp_path / "c", name="g")
    x = _data(4, 1, 3, 1)
    want = run_int(qg, x)["y"][0, -1]
    (tmp_path / "main.cpp").write_text(f"""#include <cstdio>
#include "r.h"
#include "g.h"
static r_state_t s;
static g_state_t gs;
int main() {{
    const float x[3][4] = {{{", ".join("{" + ", ".join(f"{float(v)!r}f" for v in row) + "}" for row in x[0])}}};
    r_in_t xq[4];
    r_out_t y[R_OUTPUT_SIZE];
    g_q_t gx[G_INPUT_SIZE] = {{0}}, gy[G_OUTPUT_SIZE];
    r_reset(&s);
    for (int t = 0; t < 3; t++) {{
        r_quantize_input(x[t], xq, 4);
        (void)r_step(&s, xq, y);
    }}
    g_reset(&gs);
    (void)g_step(&gs, gx, gy);
    for (int i = 0; i < R_OUTPUT_SIZE; i++) std::printf("%d ", (int)y[i]);
    return 0;
}}
""")
    objs = []
    for src in (tmp_path / "c").glob("*.c"):
        obj = tmp_path / (src.stem + ".o")
        subprocess.run(["gcc", "-std=c99", "-O1", "-c", str(src), "-o", str(obj), f"-I{tmp_path / 'c'}"], check=True)
        objs.append(str(obj))
    subprocess.run(["g++", "-std=c++11", "-Wall", "-Werror", f"-I{tmp_path / 'c'}", str(tmp_path / "main.cpp"),
                    *objs, "-o", str(tmp_path / "m"), "-lm"], check=True)
    out = subprocess.run([str(tmp_path / "m")], capture_output=True, text=True, check=True).stdout
    assert [int(v) for v in out.split()] == [int(v) for v in want]


def test_a_re_export_removes_the_files_of_a_gru_it_no_longer_has(tmp_path):
    """Exporting again under the same name a model whose GRU is named otherwise: the earlier
    export's GRU files (its NAME.h included them) go, with consent; a user's file, and another
    export whose name starts alike, stay."""
    first = api.calibrate(causal_graph(), _data(6, 24, 20, 0), method="minmax", check=False)
    g = causal_graph()
    g.nodes = [Node("rnn", n.op, n.inputs, n.outputs, n.attrs, n.params) if n.op == "gru" else n for n in g.nodes]
    second = api.calibrate(g, _data(6, 24, 20, 0), method="minmax", check=False)
    api.export_c(first, tmp_path, name="m")
    api.export_c(first, tmp_path, name="m_x")  # another export whose name starts with m_
    (tmp_path / "m_gru_notes.h").write_text("/* mine */\n")
    old = {f for f in api.export_c(first, tmp_path, name="m", force=True).files if f.startswith("m_gru")}
    assert old == {"m_gru.c", "m_gru.h", "m_gru_params.c", "m_gru_params.h"}  # the GRU node's files
    asked = []
    with pytest.raises(QtoolError, match="m_gru.h, m_gru.c, m_gru_params.h, m_gru_params.c; use `force`"):
        api.export_c(second, tmp_path, name="m", confirm=lambda q: asked.append(q))
    assert "and remove m_gru.h, m_gru.c, m_gru_params.h, m_gru_params.c" in asked[0]
    res = api.export_c(second, tmp_path, name="m", force=True)
    assert sorted(res.removed) == sorted(old) and "m_rnn.c" in res.files
    assert not any((tmp_path / f).exists() for f in old) and (tmp_path / "m_gru_notes.h").exists()
    assert (tmp_path / "m_x.h").exists() and (tmp_path / "m_x_gru.c").exists()
