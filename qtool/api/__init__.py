"""The Python API: the pipeline as functions that take models and data and return objects. The
command line (qtool.cli) only turns arguments into these calls and results into tables or JSON;
notebooks, training scripts and distributed runs call the same functions.

    import qtool
    model = qtool.load_model("model.safetensors")          # or .pt, .keras, .onnx, haste .npz
    qm = qtool.calibrate(model, "calib.npy", bits="int8", method="mse")
    qtool.save(qm, "q.h5")
    res = qtool.simulate(qm, "test.npy")
    print(res.output.snr_db, res.output.cosine)
    qtool.export_c(qm, "out/c", name="digits")
    print(qtool.verify(qm, "out/c", "test.npy"))

Data arguments take a file path (.npy, .npz, .h5), a float array `[N, T, C]` or a SequenceData; a
model of several inputs takes a .npz/.h5 file of an array per input, named after it, or a dict.
Every user error raises qtool.errors.QtoolError with a one-line message.
"""

# ruff: noqa: F401  (the package face: it re-exports the verbs, their types and FRONT_END from the modules)
from qtool.api.advice import advise
from qtool.api.calibration import Calibration, calibrate, check_calibration_options, file_ranges, observe
from qtool.api.common import (
    GRU_ONLY_VERBS,
    ONLY_FOR,
    DataLike,
    Progress,
    as_data,
    axes_notes,
    count,
    describe_check,
    mode_explanation,
    model_file_format,
    range_notes,
    saturation_notes,
)
from qtool.api.comparison import Comparison, compare
from qtool.api.compiling import PRESETS, needs_compile, precompile
from qtool.api.export import ExportResult, export_c, export_tables, find_export
from qtool.api.models import (
    Inspection,
    gru_names,
    import_lines,
    import_note,
    inspect,
    is_whole_model,
    load,
    load_model,
    save,
    whole_model,
)
from qtool.api.report import ReportResult, html_report
from qtool.api.rows import op_text, qgraph_rows, steps_text
from qtool.api.simulation import SimulationResult, load_labels, simulate
from qtool.api.verification import VerifyResult, verify
from qtool.core.graph import Graph
from qtool.core.model import DIRECTIONS, GruModel
from qtool.core.qgraph import QGraph
from qtool.core.qmodel import QuantModel
from qtool.core.tensors import cell_params, cell_tensors
from qtool.importers.once import read_once
from qtool.io.files import SequenceData, claim_output

# What a front end (the command line, a notebook's display, a GUI) reads besides the verbs
# (qtool.API) and their results, to show them as qtool does: docs/api.md, "For front ends". The
# command line uses nothing else of qtool's (tests/project/test_layers.py).
FRONT_END = ("DIRECTIONS", "PRESETS", "cell_params", "cell_tensors", "check_calibration_options", "claim_output",
             "describe_check", "file_ranges", "import_lines", "import_note", "is_whole_model", "mode_explanation",
             "model_file_format", "needs_compile", "op_text", "qgraph_rows", "read_once", "steps_text")
TYPES = ("Graph", "GruModel", "QGraph", "QuantModel", "SequenceData", "Inspection", "Calibration", "Comparison",
         "SimulationResult", "ExportResult", "VerifyResult", "ReportResult")
__all__ = ["advise", "as_data", "calibrate", "compare", "export_c", "export_tables", "html_report", "inspect", "load",
           "load_model", "observe", "precompile", "save", "simulate", "verify", *TYPES, *FRONT_END]
