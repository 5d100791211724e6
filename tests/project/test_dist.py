"""Distributed runs (qtool.parallel): `mpiexec -n R qtool calibrate/simulate` give files identical to
one process's, errors on any rank end every rank with one line, and the AllGather +
int8 matmul + dequantize operator is exact on 1, 2 and 3 ranks with a different A on every
rank. The MPI runs launch mpiexec (from the `mpi` extra); without it they are skipped."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import has, random_model
from h5compare import h5_contents
from qtool.calibrators import METHODS as CALIBRATION_METHODS

HERE = Path(__file__).resolve().parent.parent  # tests/, with the scripts mpiexec runs
MPIEXEC = shutil.which("mpiexec", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                         os.environ.get("PATH", "")]))
needs_mpi = pytest.mark.skipif(not (has("mpi4py") and MPIEXEC),
                               reason="MPI runs need mpi4py and mpiexec: pip install 'qtool[mpi]'")
CLI = ("-c", "from qtool.cli.app import main; main()")
METHODS = tuple(CALIBRATION_METHODS)  # every calibration method


def mpi_env() -> dict[str, str]:
    """The ranks' environment: one thread per rank (the ranks share the machine's cores)."""
    env = {k: v for k, v in os.environ.items() if k != "QTOOL_MPI"}
    env.update(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               NUMBA_ENABLE_CUDASIM="1")
    return env


def mpirun(n: int, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    """`mpiexec -n n python ARGS` (mpi_env)."""
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=mpi_env())


def assert_same_file(a: Path, b: Path) -> None:
    ca, cb = h5_contents(a), h5_contents(b)
    assert sorted(ca) == sorted(cb)
    differ = [k for k in ca if not np.array_equal(np.asarray(ca[k]), np.asarray(cb[k]))]
    assert not differ, f"{a.name} and {b.name} differ in {differ}"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A stacked bidirectional GRU; calibration data whose scale grows from chunk to chunk (so
    the histograms re-bin as they go); test data."""
    from qtool.core.model import open_h5, write_model

    d = tmp_path_factory.mktemp("dist")
    with open_h5(d / "m.h5", "w") as f:
        write_model(f, random_model(C=5, H=7, layers=2, dirs=2, seed=3))
    rng = np.random.RandomState(1)
    calib = rng.randn(150, 9, 5) * np.repeat(1.6 ** np.arange(10), 16)[:150, None, None]
    np.save(d / "calib.npy", calib.astype(np.float32))
    np.save(d / "test.npy", rng.randn(77, 9, 5).astype(np.float32))
    return d


@pytest.fixture(scope="module")
def qmodel(files):
    """A quantized model of `files`' GRU (min/max)."""
    from qtool import api

    api.save(api.calibrate(files / "m.h5", files / "calib.npy"), files / "q.h5", force=True)
    return files / "q.h5"


# --- without MPI -------------------------------------------------------------------------------

def test_no_mpi_without_mpiexec(monkeypatch, files, cli):
    """Outside mpiexec nothing of MPI is imported and the commands run as one process."""
    import qtool.parallel as dist

    for var in (*dist.SIZE_VARS, "QTOOL_MPI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(dist, "_world", [])
    code, _, err = cli("calibrate", files / "m.h5", files / "calib.npy", "-o", files / "plain.h5", "--force")
    assert code == 0, err
    assert dist.world() is None and "mpi4py" not in sys.modules


def test_mpiexec_without_mpi4py_is_one_clear_line(monkeypatch, files, cli):
    import qtool.parallel as dist

    monkeypatch.setenv("PMI_SIZE", "4")
    monkeypatch.delenv("QTOOL_MPI", raising=False)
    monkeypatch.setattr(dist, "_world", [])
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import fails
    code, out, err = cli("calibrate", files / "m.h5", files / "calib.npy", "-o", files / "x.h5")
    assert code == 2 and err.count("\n") == 1 and "one of 4 processes" in err and "qtool[mpi]" in err
    monkeypatch.setenv("QTOOL_MPI", "0")  # the way out it names
    monkeypatch.setattr(dist, "_world", [])
    assert dist.world() is None


def test_histogram_merge_lands_on_one_process_width():
    """Two chunks whose naive merge picks a coarser histogram than one pass does: the logged
    merge replays one pass's widths and equals it exactly."""
    from qtool.calibrators.kl import KlObserver
    from qtool.calibrators.percentile import PercentileObserver

    from qtool.parallel.calibrate import Logged, merge_logged

    chunks = [np.array([0.5, 100.0], np.float32), np.array([100.0, 8190.4], np.float32)]
    for cls in (KlObserver, PercentileObserver):
        one = cls()
        for c in chunks:
            one.observe(c)
        parts = [cls(), cls()]
        for o, c in zip(parts, chunks):
            o.observe(c)
        assert parts[0].merge(parts[1]).hist.w != one.hist.w  # the order-free merge cannot match
        clock = [0]
        logged = [Logged(cls(), clock), Logged(cls(), clock)]
        for k, (o, c) in enumerate(zip(logged, chunks)):
            clock[0] = k
            o.observe(c)
        exact = merge_logged([(o.inner, o.log) for o in logged])
        assert (exact.hist.w, exact.hist.start, exact.hist.lo, exact.hist.hi) == \
               (one.hist.w, one.hist.start, one.hist.lo, one.hist.hi)
        assert np.array_equal(exact.hist.counts, one.hist.counts) and exact.range() == one.range()


@pytest.mark.parametrize("method", METHODS)
def test_logged_merge_equals_one_pass(method):
    """Chunks dealt round-robin to 3 'ranks' and merged equal one pass over them in order,
    field for field (ema too: its recurrence is replayed in chunk order)."""
    from qtool.calibrators import make_observer

    from qtool.parallel.calibrate import Logged, merge_logged

    rng = np.random.RandomState(7)
    chunks = [(rng.randn(9, 4, 3) * 1.5**k + k).astype(np.float32) for k in range(8)]
    one = make_observer(method, "h")
    for c in chunks:
        one.observe(c)
    clock = [0]
    ranks = [Logged(make_observer(method, "h"), clock) for _ in range(3)]
    for k, c in enumerate(chunks):
        clock[0] = k
        ranks[k % 3].observe(c)
    merged = merge_logged([(o.inner, o.log) for o in ranks])
    assert vars(merged).keys() == vars(one).keys()
    for key, value in vars(one).items():
        if key == "hist":
            assert vars(merged.hist).keys() == vars(value).keys()
            for k2, v2 in vars(value).items():
                assert np.array_equal(getattr(merged.hist, k2), v2), (method, k2)
        else:
            assert np.array_equal(getattr(merged, key), value), (method, key)


@pytest.mark.parametrize("mode", ["integer", "fakequant", "both"])
def test_chunk_partials_fold_to_one_pass(files, qmodel, mode):
    """Per-chunk partial statistics, folded in chunk order whatever order they arrive in, give
    one pass's results exactly (the fake-quant side's distances and agreement too)."""
    from qtool import api
    from qtool.simulation.fold import chunk_stats, fold_in_chunk_order
    from qtool.simulation.run import Simulation

    qm = api.load(qmodel)
    x = np.load(files / "test.npy")
    one, sim, acc = Simulation(qm, mode=mode), Simulation(qm, mode=mode), Simulation(qm, mode=mode)
    parts = []
    for start in range(0, len(x), 10):
        one.run_chunk(x[start:start + 10])
        parts.append((start, chunk_stats(sim, x[start:start + 10])[0]))
    fold_in_chunk_order(acc, parts[::-1])
    assert json.dumps(acc.results()) == json.dumps(one.results())
    assert json.dumps(sim.results()) == json.dumps(Simulation(qm, mode=mode).results())  # left as it was


def test_commands_that_are_not_distributed_are_refused(monkeypatch):
    """Under mpiexec a command that would run whole on every rank (each writing the same files)
    stops with one line; calibrate, simulate and the read-only ones run."""
    import qtool.parallel as dist
    from qtool.errors import QtoolError

    monkeypatch.setattr(dist, "_world", [object()])
    for name in ("calibrate", "simulate", "inspect", "version", None):
        dist.check_command(name)
    for name in ("export", "verify", "import", "report"):
        with pytest.raises(QtoolError, match=f"qtool {name} runs as one process"):
            dist.check_command(name)


# --- under mpiexec ---------------------------------------------------------------------------

@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_operator_strict(ranks):
    """The AllGather + int8 matmul + dequantize operator on R ranks, R / 2 ranks and 1 rank,
    every rank with its own A_i and its own b: int32 exact and float16 bit-identical to the
    single-process reference (uneven rows, a rank with none, chunks that do not divide them, K
    not a multiple of 64, -128 and 127, permuted rows, the CUDA backend under the simulator, a
    bad argument on one rank)."""
    p = mpirun(ranks, HERE / "mpi_operator.py")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(", 0 in all") == ranks


@needs_mpi
def test_calibrate_every_method_on_three_ranks_equals_one_process(files, tmp_path):
    """Every method, dataset for dataset (ema included: its EMA is replayed in data order);
    three ranks, so the states merge in a tree that is not a power of two."""
    from qtool import api

    p = mpirun(3, HERE / "mpi_calibrate.py", files / "m.h5", files / "calib.npy", tmp_path, 16)
    assert p.returncode == 0, p.stderr
    one = api.observe(files / "m.h5", files / "calib.npy", methods=METHODS, batch_size=16)
    for k, method in enumerate(METHODS):
        api.save(one.quant_model(k), tmp_path / f"one_{method}.h5")
        assert_same_file(tmp_path / f"one_{method}.h5", tmp_path / f"{method}.h5")


@needs_mpi
def test_mpiexec_calibrate_and_simulate_save_equal_one_process(files, tmp_path, cli):
    """`mpiexec -n 2 qtool calibrate` writes the same quantized model as one process, and
    `mpiexec -n 3 qtool simulate --mode both --save` the same results file and metrics (the
    integer GRU's and the fake-quant GRU's, with their agreement)."""
    args = ("calibrate", files / "m.h5", files / "calib.npy", "--method", "kl", "--batch-size", 16)
    code, _, err = cli(*args, "-o", tmp_path / "q1.h5")
    assert code == 0, err
    p = mpirun(2, *CLI, *args, "-o", tmp_path / "q2.h5")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("calibrated in") == 1  # rank 0 alone prints
    assert_same_file(tmp_path / "q1.h5", tmp_path / "q2.h5")

    # chunks of 10 sequences keep every metric's dot product below OpenBLAS's threading threshold
    # (10,000 elements), so this process's BLAS threads and the ranks' single threads sum alike
    args = ("simulate", tmp_path / "q1.h5", files / "test.npy", "--batch-size", 10, "--mode", "both", "--json")
    code, out, err = cli(*args, "--save", tmp_path / "r1.h5")
    assert code == 0, err
    p = mpirun(3, *CLI, *args, "--save", tmp_path / "r3.h5")
    assert p.returncode == 0, p.stderr
    one, three = json.loads(out), json.loads(p.stdout)
    one.pop("seconds"), three.pop("seconds")
    assert one == three
    assert_same_file(tmp_path / "r1.h5", tmp_path / "r3.h5")
    assert sorted(q.name for q in tmp_path.iterdir()) == ["q1.h5", "q2.h5", "r1.h5", "r3.h5"]


@needs_mpi
def test_error_on_one_rank_stops_every_rank(files, qmodel, tmp_path, cli):
    """A NaN in a chunk of rank 1 (of 3), and a write that fails on rank 0 alone after the
    others finished: one error line (one process's), exit code 2, nothing left behind."""
    x = np.load(files / "test.npy")
    x[45, 3, 1] = np.nan  # chunk 4 of 10-sequence chunks: rank 1's in the second round
    np.save(tmp_path / "bad.npy", x)
    args = ("simulate", qmodel, tmp_path / "bad.npy", "--batch-size", 10)
    code, _, err_one = cli(*args)
    p = mpirun(3, *CLI, *args, "--save", tmp_path / "r.h5")
    assert code == p.returncode == 2
    assert p.stderr.strip() == err_one.strip() and "sequence 45 contains NaN" in p.stderr
    (tmp_path / "file").write_text("a file, not a directory")
    args = ("calibrate", files / "m.h5", files / "calib.npy", "-o", tmp_path / "file" / "q.h5")
    code, _, err_one = cli(*args)
    p = mpirun(2, *CLI, *args)
    assert code == p.returncode == 2 and p.stderr.strip() == err_one.strip(), p.stderr
    assert sorted(q.name for q in tmp_path.iterdir()) == ["bad.npy", "file"]


def test_float16_rounding_equals_numpy():
    """The CPU epilogue's float32 -> float16 rounding (on the bits: numba has no float16) equals
    numpy's astype on every exponent, both signs, every tie pattern, subnormals, overflow,
    inf and NaN."""
    from qtool.parallel.half import halves

    exps = np.arange(256, dtype=np.uint32) << 23
    ties = np.arange(1024, dtype=np.uint32) << 13  # every float16 significand, exactly at a tie and beside it
    low = np.arange(4096, dtype=np.uint32)  # what subnormal results round away
    some = np.random.default_rng(0).integers(0, 1 << 23, 2000, dtype=np.uint32)
    mant = np.unique(np.concatenate([ties | 0x1000, ties | 0x0FFF, ties | 0x1001, ties, low, some]))
    bits = (exps[:, None] | (mant[None, :] & 0x7FFFFF)).ravel()
    x = np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)
    out = np.empty(x.size, np.uint16)
    halves(x, out)
    with np.errstate(over="ignore"):
        assert np.array_equal(out, x.astype(np.float16).view(np.uint16))


@needs_mpi
def test_ctrl_c_stops_every_rank_and_leaves_nothing(files, qmodel, tmp_path):
    """SIGINT to mpiexec while rank 0 writes --save: every rank ends (exit 128 + 2), rank 0
    says so once, and its temporary file is gone."""
    import signal
    import time

    np.save(tmp_path / "long.npy", np.random.RandomState(2).randn(4000, 9, 5).astype(np.float32))
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, *CLI, "simulate", qmodel, tmp_path / "long.npy",
                          "--batch-size", "4", "--save", out / "r.h5"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=mpi_env())
    deadline = time.monotonic() + 120
    while not any(out.iterdir()) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until rank 0 has its temporary file open
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGINT, err
    # rank 0 may hear of rank 1's signal before its own: "interrupted (SIGINT on rank 1)"
    assert err.count("interrupted (SIGINT") == 1 and not any(out.iterdir()), err


def _rank_pid(token: str, rank: int) -> int | None:
    """The pid of MPI rank `rank` of the run started with QTOOL_TEST_RUN=token (hydra sets PMI_RANK)."""
    want = {f"PMI_RANK={rank}".encode(), f"QTOOL_TEST_RUN={token}".encode()}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and want <= set((proc / "environ").read_bytes().split(b"\0")):
                return int(proc.name)
        except OSError:
            continue
    return None


@needs_mpi
def test_signal_to_one_other_rank_removes_rank_0s_temporary(files, qmodel, tmp_path):
    """SIGTERM to rank 1 alone (a scheduler or the OOM killer stops one process): rank 0 hears
    of it, says so once, removes its temporary --save file, and every rank ends (128 + 15)."""
    import signal
    import time

    np.save(tmp_path / "long.npy", np.random.RandomState(2).randn(4000, 9, 5).astype(np.float32))
    env = {k: v for k, v in os.environ.items() if k != "QTOOL_MPI"}
    env.update(NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", QTOOL_TEST_RUN=str(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, *CLI, "simulate", qmodel, tmp_path / "long.npy",
                          "--batch-size", "4", "--save", out / "r.h5"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not any(out.iterdir()) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until rank 0 has its temporary file open
    os.kill(_rank_pid(str(tmp_path), 1), signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert err.count("interrupted (SIGTERM") == 1 and not any(out.iterdir()), err


@needs_mpi
def test_mpiexec_simulates_a_whole_model_as_one_process(tmp_path, cli):
    """A whole model (the bundled ONNX classifier) on 2 ranks: the same per-edge and output
    metrics, top-1 and accuracies, and the same --save file, as one process."""
    from conftest import SAMPLES

    code, _, err = cli("calibrate", SAMPLES / "digits.onnx", SAMPLES / "calib.npy", "-o", tmp_path / "q.h5",
                       "--no-check", "--method", "minmax")
    assert code == 0, err
    args = ("simulate", tmp_path / "q.h5", SAMPLES / "test.npy", "--labels", SAMPLES / "test_labels.npy",
            "--batch-size", 10, "--json", "--backend", "cpu")
    code, out, err = cli(*args, "--save", tmp_path / "r1.h5")
    assert code == 0, err
    p = mpirun(2, *CLI, *args, "--save", tmp_path / "r2.h5")
    assert p.returncode == 0, p.stderr
    one, two = json.loads(out), json.loads(p.stdout)
    one.pop("seconds"), two.pop("seconds")
    assert one == two and one["top1_agreement"] > 0.98
    assert_same_file(tmp_path / "r1.h5", tmp_path / "r2.h5")
