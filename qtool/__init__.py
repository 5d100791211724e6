"""qtool: integer-only GRUs for microcontrollers and DSPs, calibrated and simulated bit-exactly.

The pipeline as Python functions (qtool.api; imported on first use so that `import qtool` stays
cheap), one per verb, each taking a GRU alone or a whole model: load_model, load, save, inspect,
calibrate, compare, advise, simulate, html_report, export_c, export_tables, verify, plus
as_data, observe and precompile.
"""

from qtool.version import __version__

API = ("advise", "as_data", "calibrate", "compare", "export_c", "export_tables", "html_report", "inspect", "load",
       "load_model", "observe", "precompile", "save", "simulate", "verify")
__all__ = ["__version__", *API]


def __getattr__(name: str):
    if name in API:
        from qtool import api

        return getattr(api, name)
    raise AttributeError(f"module 'qtool' has no attribute {name!r}")


def _source_checkout_parts() -> None:
    """`calibrators/` and `exporters/` sit beside `qtool/` in the repository (its top level) and
    inside it once installed (setup.py's package_dir): in a source checkout, a finder maps
    `qtool.calibrators` and `qtool.exporters` to them, and no other name."""
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(here)
    parts = {f"qtool.{p}": os.path.join(top, p) for p in ("calibrators", "exporters")
             if not os.path.isdir(os.path.join(here, p)) and os.path.isfile(os.path.join(top, p, "__init__.py"))}
    if not parts:
        return

    class SourceParts:
        @staticmethod
        def find_spec(name: str, path=None, target=None):
            if name not in parts:
                return None
            return importlib.util.spec_from_file_location(
                name, os.path.join(parts[name], "__init__.py"), submodule_search_locations=[parts[name]])

    sys.meta_path.insert(0, SourceParts)


def _seed_numba_cache() -> None:
    """Before any kernel module is imported: a read-only installation's shipped kernels, into the
    user's numba cache (qtool/install/cache_seed.py)."""
    from qtool.install.cache_seed import seed_quietly

    seed_quietly()


_source_checkout_parts()
_seed_numba_cache()
