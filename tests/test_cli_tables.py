"""What the CLI prints: tensor names whole at 80 columns (a pipe, a CI log, a default terminal), never
cut to 'layer0.fw…'; a model file's fingerprint once; the file that stands where an output's
directory must go."""

import io

import numpy as np
from conftest import calibrated, random_model
from rich.console import Console

from qtool.report import both_table


def _render(table) -> str:
    console = Console(width=80, file=io.StringIO())
    console.print(table)
    return console.file.getvalue()


def test_both_table_keeps_tensor_names_whole_at_80_columns():
    names = [f"layer{layer}.bwd.{t}" for layer in (0, 1) for t in ("h", "old_contrib", "Rh_add_br")]
    integer = {"snr_db": 23.38, "exact": False}
    fake = {"snr_db": 29.38, "exact": False}
    results = {"output": integer, "tensors": {n: integer for n in names},
               "fakequant": {"output": fake, "tensors": {n: fake for n in names},
                             "agreement": {n: {"identical": 0.5, "max_lsb": 4} for n in ["output", *names]}}}
    text = _render(both_table(results, "integer and fake-quant vs float"))
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    for name in names:
        assert any(f"│ {name} " in line for line in lines), name
    assert "…" not in text


def test_a_loaded_model_saves_again_and_inspect_lists_its_fingerprint_once(tmp_path):
    import qtool
    from qtool.report import provenance_table

    qm = calibrated(random_model(C=3, H=4), np.random.RandomState(1).randn(4, 5, 3))
    qtool.save(qm, tmp_path / "q.h5")
    loaded = qtool.load(tmp_path / "q.h5")
    qtool.save(loaded, tmp_path / "again.h5")  # raised TypeError: two values for 'fingerprint'
    again = qtool.load(tmp_path / "again.h5")
    assert again.fingerprint() == qm.fingerprint() == again.info["fingerprint"]
    text = _render(provenance_table(again))
    assert text.count("fingerprint") == 1 and qm.fingerprint() in text


def test_an_output_under_a_file_names_that_file(cli, tmp_path):
    import qtool

    qtool.save(calibrated(random_model(C=3, H=4), np.random.RandomState(1).randn(4, 5, 3)), tmp_path / "q.h5")
    (tmp_path / "notes").write_text("mine")
    for out in (tmp_path / "notes" / "p.json", tmp_path / "notes" / "sub" / "p.json"):
        code, _, err = cli("export", "json", tmp_path / "q.h5", "-o", out)
        assert code == 2 and f"{tmp_path / 'notes'} is a file, not a directory" in err, err
    assert (tmp_path / "notes").read_text() == "mine"


def test_saved_results_record_the_simulation_mode(cli, tmp_path):
    import h5py

    import qtool

    qtool.save(calibrated(random_model(C=3, H=4), np.random.RandomState(1).randn(4, 5, 3)), tmp_path / "q.h5")
    np.save(tmp_path / "test.npy", np.random.RandomState(2).randn(3, 5, 3).astype(np.float32))
    y_int = {}
    for mode in ("integer", "fakequant"):
        code, _, err = cli("simulate", tmp_path / "q.h5", tmp_path / "test.npy", "--mode", mode,
                           "--save", tmp_path / f"{mode}.h5")
        assert code == 0, err
        with h5py.File(tmp_path / f"{mode}.h5") as f:
            assert f.attrs["mode"] == mode
            y_int[mode] = f["quant/y_int"][:]
    # what makes the attribute necessary: the two files' quant/ differ
    assert not np.array_equal(y_int["integer"], y_int["fakequant"])
