"""qtool: integer-only GRUs for microcontrollers and DSPs, calibrated and simulated bit-exactly.

The pipeline as Python functions (qtool.api; imported on first use so that `import qtool` stays
cheap): load_model, calibrate, advise, compare, simulate, save, load, export_c, verify, html_report.
"""

__version__ = "0.1.0"

API = ("advise", "as_data", "calibrate", "compare", "export_c", "html_report", "load", "load_model",
       "load_model_for_data", "observe", "save", "save_model", "simulate", "verify")
__all__ = ["__version__", *API]


def __getattr__(name: str):
    if name in API:
        from qtool import api

        return getattr(api, name)
    raise AttributeError(f"module 'qtool' has no attribute {name!r}")


def _seed_numba_cache() -> None:
    """Before any kernel module is imported: a read-only installation's shipped kernels, into the
    user's numba cache (qtool/cache_seed.py)."""
    from qtool.cache_seed import seed_quietly

    seed_quietly()


_seed_numba_cache()
