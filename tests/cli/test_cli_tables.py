"""What the CLI prints: tensor names whole at 80 columns (a pipe, a CI log, a default terminal), never
cut to 'layer0.fw…'; a model file's fingerprint once; the file that stands where an output's
directory must go."""

import io

import numpy as np
from conftest import calibrated, random_model
from rich.console import Console

from qtool.cli.tables import both_table


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
    from qtool.cli.tables import provenance_table

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


def test_advise_table_fits_80_columns_and_verbose_adds_the_statistics():
    from types import SimpleNamespace

    from qtool.cli.advise_tables import estimator_table, tensor_table

    row = {"layer": 1, "direction": "bwd", "mu": -0.0123, "sigma": 0.456, "M": 12.5, "p_zero_8": 1e-3,
           "p_zero_16": 1e-7, "predicted_seed_db": 31.25, "predicted_grid_db": 30.5, "measured_snr_db": 29.75,
           "bits": 16, "method": "percentile"}
    rows = [{**row, "tensor": t} for t in ("old_contrib", "Rh_add_br", "new_contrib", "z_pre")]
    advice = SimpleNamespace(rows=rows)
    text = _render(tensor_table(advice, "gru: SNR per tensor (dB)"))
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in text
    header = next(line for line in lines if "┃ layer" in line)
    for col in ("layer", "tensor", "predicted", "measured", "bits", "method"):
        assert col in header, col
    for r in rows:
        assert any(f"│ 1.bwd │ {r['tensor']} " in line and "30.5" in line and "29.8" in line and "percentile" in line
                   for line in lines), r["tensor"]
    stats = estimator_table(advice, "t")  # --verbose: a table of its own, uncut at 80 columns too
    assert [c.header for c in stats.columns][2:8] == ["mu", "sigma", "M", "P0 @8", "P0 @16", "P0 SNR"]
    text = _render(stats)
    assert all(len(line) <= 80 for line in text.splitlines()) and "…" not in text
    assert any("│ 1.bwd │ old_contrib " in line and "-0.012" in line and "12.5" in line and "1e-07" in line
               and "31.2" in line for line in text.splitlines())
