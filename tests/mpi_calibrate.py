"""Run under `mpiexec -n R python tests/mpi_calibrate.py MODEL DATA OUT_DIR BATCH`: one float pass
through the Python API observes every method at once (each rank its own chunks) and saves one
quantized model per method as OUT_DIR/METHOD.h5 (rank 0 writes)."""

import sys

from qtool.calibrators import METHODS

import qtool

if __name__ == "__main__":
    model, data, out, batch = sys.argv[1:5]
    cal = qtool.observe(model, data, methods=METHODS, batch_size=int(batch))
    for k, method in enumerate(METHODS):
        qtool.save(cal.quant_model(k), f"{out}/{method}.h5", force=True)
