"""A qtool installed by root and run by another user: numba cannot write the package's
`__pycache__`, so it neither reads the kernels the wheel ships there; qtool.install.cache_seed copies
them into the user's numba cache, where numba's own user-wide locator then finds them."""

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from qtool.install import cache_seed

SOURCE = textwrap.dedent("""
    from numba import njit

    @njit(cache=True)
    def twice(x):
        return 2 * x
""")
OWN_CACHE_DIR = os.environ.get("NUMBA_CACHE_DIR")
# numba as for a user who cannot write the package: the in-tree locator declines
RUN = ("import sys; from numba.core import caching\n"
       "caching.InTreeCacheLocator.from_function = classmethod(lambda cls, f, p: None)\n"
       "sys.path.insert(0, sys.argv[1]); import kernels; print(kernels.twice(21))")


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "NUMBA_ENABLE_CUDASIM")}
    return {**env, "XDG_CACHE_HOME": str(tmp_path / "home-cache"), "NUMBA_DEBUG_CACHE": "1"}


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A package whose kernel was compiled into its own __pycache__ (as the wheel build does)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "kernels.py").write_text(SOURCE)
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "NUMBA_ENABLE_CUDASIM")}
    code = f"import sys; sys.path.insert(0, {str(pkg)!r}); import kernels; kernels.twice(1)"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    for k, v in _env(tmp_path).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    return pkg


def test_a_read_only_package_cache_is_copied_where_numba_looks_for_it(shipped, tmp_path, monkeypatch):
    cache = shipped / "__pycache__"
    assert len(list(cache.glob("*.nbi"))) == 1
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == cache else access(p, mode))
    assert cache_seed.seed_user_cache([shipped]) == 1
    assert cache_seed.seed_user_cache([shipped]) == 0  # the user's index is kept
    run = subprocess.run([sys.executable, "-c", RUN, str(shipped)], env=_env(tmp_path),
                         capture_output=True, text=True, check=True)
    log = run.stdout + run.stderr
    assert run.stdout.strip().endswith("42")
    assert f"data loaded from '{tmp_path / 'home-cache' / 'numba'}" in log, log
    assert "data saved to" not in log, log


def test_a_writable_package_cache_is_left_to_numba(shipped, tmp_path):
    assert cache_seed.seed_user_cache([shipped]) == 0
    assert not (tmp_path / "home-cache").exists()


def test_numba_cache_dir_is_left_alone(shipped, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(shipped / "elsewhere"))
    access = os.access  # every folder read-only but the one NUMBA_CACHE_DIR names
    monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) if Path(p) == shipped / "elsewhere" else False)
    assert cache_seed.seed_user_cache([shipped]) == 0


def test_without_a_writable_home_numba_is_sent_to_a_private_temporary_folder(shipped, tmp_path, monkeypatch):
    from numba.core import config

    cache = shipped / "__pycache__"
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == cache else access(p, mode))
    monkeypatch.setattr(cache_seed, "writable_dir", lambda path: False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    try:
        assert cache_seed.seed_user_cache([shipped]) == 1
        base = tmp_path / f"qtool-numba-{os.getuid()}"
        assert os.environ["NUMBA_CACHE_DIR"] == str(base) == config.CACHE_DIR
        assert base.stat().st_mode & 0o777 == 0o700
    finally:  # this process's numba back to its own cache
        os.environ.pop("NUMBA_CACHE_DIR", None)
        if OWN_CACHE_DIR is not None:
            os.environ["NUMBA_CACHE_DIR"] = OWN_CACHE_DIR
        config.reload_config()
    env = {**_env(tmp_path), "NUMBA_CACHE_DIR": str(base)}
    run = subprocess.run([sys.executable, "-c", RUN, str(shipped)], env=env, capture_output=True, text=True, check=True)
    log = run.stdout + run.stderr
    assert f"data loaded from '{base}" in log, log
    assert "data saved to" not in log, log


def test_a_read_only_package_without_a_shipped_cache_gets_a_cache_folder_too(tmp_path, monkeypatch):
    """QTOOL_PRECOMPILE=0 installed by root, run without a writable home: numba would fail with
    "cannot cache function"; it gets the private temporary folder as above."""
    from numba.core import config

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == pkg else access(p, mode))
    monkeypatch.setattr(cache_seed, "writable_dir", lambda path: False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    try:
        assert cache_seed.seed_user_cache([pkg]) == 0  # nothing to copy
        assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / f"qtool-numba-{os.getuid()}") == config.CACHE_DIR
    finally:
        os.environ.pop("NUMBA_CACHE_DIR", None)
        if OWN_CACHE_DIR is not None:
            os.environ["NUMBA_CACHE_DIR"] = OWN_CACHE_DIR
        config.reload_config()


def test_an_unwritable_numba_cache_dir_is_replaced_like_a_missing_one(tmp_path, monkeypatch):
    """NUMBA_CACHE_DIR naming a file, with a read-only package: numba would fail every command
    with "cannot cache function"; qtool sends it to a folder it can write instead."""
    from numba.core import config

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "a-file"))
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == pkg else access(p, mode))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    try:
        cache_seed.seed_user_cache([pkg])
        assert os.environ.get("NUMBA_CACHE_DIR") != str(tmp_path / "a-file") != config.CACHE_DIR
        assert (tmp_path / "a-file").read_text() == ""
    finally:
        os.environ.pop("NUMBA_CACHE_DIR", None)
        if OWN_CACHE_DIR is not None:
            os.environ["NUMBA_CACHE_DIR"] = OWN_CACHE_DIR
        config.reload_config()
