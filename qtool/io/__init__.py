"""Files: outputs written safely, sequence data read in chunks, simulation results."""
