"""Let a user who cannot write the installed package start from the kernels it ships.

`pip install .` leaves numba's cache in the package's own `__pycache__` folders
(qtool/install/precompile.py). numba reads that cache only where it may also write it: for a qtool that
root installed and another user runs, numba turns to the user's cache directory
(~/.cache/numba/<folder>_<sha1 of the folder's path>) and compiles everything again, about
25 s. Copying the shipped index and data files there first gives that user the same warm start.
An index the user already has is kept (it may hold kernels compiled since); numba ignores a
stale one and overwrites it. A user without a writable cache directory either (no home folder:
a service account, `docker run --user`) would get numba's "cannot cache function" error:
qtool points NUMBA_CACHE_DIR at a private folder under the system's temporary one instead.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # the installed qtool, calibrators and exporters inside it


def shipped_caches(roots: list[Path]) -> list[Path]:
    """Every `__pycache__` folder under `roots` that holds numba index files (*.nbi)."""
    return sorted({p.parent for root in roots for p in root.rglob("__pycache__/*.nbi")})


def user_cache_dir(cache: Path, base: Path) -> Path:
    """Where numba's user-wide locator (or NUMBA_CACHE_DIR's) caches the kernels of the sources
    beside `cache`, under the cache directory `base`."""
    from numba.core.caching import _CacheLocator

    return base / _CacheLocator.get_suitable_cache_subpath(str(cache.parent / "any.py"))


def writable_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)


def cache_base() -> Path:
    """The user's numba cache directory; where that cannot be written, a folder of this user's
    own under the temporary directory, which numba is then told to use (NUMBA_CACHE_DIR)."""
    import tempfile

    from numba.misc.appdirs import AppDirs

    base = Path(AppDirs(appname="numba", appauthor=False).user_cache_dir)
    if writable_dir(base):
        return base
    base = Path(tempfile.gettempdir()) / f"qtool-numba-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    st = base.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:  # not ours alone: another user could plant code
        base = Path(tempfile.mkdtemp(prefix="qtool-numba-"))
    os.environ["NUMBA_CACHE_DIR"] = str(base)
    from numba.core import config

    config.reload_config()
    return base


def copy_index(index: Path, dest: Path) -> None:
    """One kernel's index (name.nbi) with its data files (name.N.nbc), the index last so that
    a reader never finds an index without its data."""
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    base = index.name[: -len(".nbi")]
    for f in [*index.parent.glob(f"{base}.*.nbc"), index]:
        tmp = dest / f".{f.name}.{os.getpid()}.tmp"
        shutil.copyfile(f, tmp)
        os.replace(tmp, dest / f.name)


def _in_tree_writable(root: Path) -> bool:
    cache = root / "__pycache__"
    return os.access(cache if cache.is_dir() else root, os.W_OK)


def seed_user_cache(roots: list[Path] | None = None) -> int:
    """Copy the shipped caches that numba cannot use in place (their folder is not writable)
    into the user's numba cache, where that has no index for them yet; returns how many kernels'
    indexes were copied. With NUMBA_CACHE_DIR set numba uses that folder alone: left as it is,
    unless it cannot be written, when qtool chooses as without it. Runs at every `import qtool`:
    a writable installation costs a few `access` calls."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        if writable_dir(Path(os.environ["NUMBA_CACHE_DIR"])):
            return 0
        del os.environ["NUMBA_CACHE_DIR"]  # a file, or not ours: numba would say "cannot cache function"
        from numba.core import config

        config.reload_config()
    if roots is None:
        roots = [PACKAGE]
    if all(_in_tree_writable(r) for r in roots if r.is_dir()):
        return 0  # numba reads and writes the packages' own caches
    # read-only: the user's cache (also for a package without a shipped one, QTOOL_PRECOMPILE=0)
    base = cache_base()
    copied = 0
    for cache in shipped_caches(roots):
        dest = user_cache_dir(cache, base)
        for index in cache.glob("*.nbi"):
            if not (dest / index.name).exists():
                copy_index(index, dest)
                copied += 1
    return copied


def seed_quietly() -> None:
    """seed_user_cache, where a failure (no home folder, numba's internals moved) only means the
    kernels compile on first use, as they would without it."""
    try:
        seed_user_cache()
    except (OSError, ImportError, AttributeError):
        pass
