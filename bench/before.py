"""The older source a bench compares this one against: `flowmagic/` at a named commit, put
in a folder of its own that goes first on the PYTHONPATH of the runs that measure it.

`make bench` takes it from git (`git archive <commit> flowmagic`) when the repository is a
git checkout that has the commit; from a source archive, an installed copy or a shallow
clone without the commit there is nothing to take it from, and the "before" runs are not
made (one line says why and how to give one: `--before DIR`, a folder holding `flowmagic/`).
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

__all__ = ["prepare", "given"]


def _git(root: Path, *args: str, text: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=text,
                          timeout=120)


def given(folder: str | Path) -> tuple[Path | None, str]:
    """A folder the user gave: it must hold a `flowmagic/` package."""
    path = Path(folder).resolve()
    if not (path / "flowmagic" / "__init__.py").is_file():
        return None, (f"{path} holds no flowmagic/ package: the 'before' runs are not made; "
                      "--before takes a folder holding an older flowmagic/")
    return path, f"flowmagic/ from {path}"


def prepare(ref: str, root: Path, dest: Path) -> tuple[Path | None, str]:
    """`flowmagic/` of commit `ref` of the checkout at `root`, extracted into `dest`.

    Returns (dest, what it holds) or (None, why not). Nothing else of the commit is taken:
    the bench's own code stays this one, so both sides are measured by the same harness."""
    try:
        inside = _git(root, "rev-parse", "--is-inside-work-tree")
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"git is not usable here ({exc}): {_instead(ref)}"
    if inside.returncode or inside.stdout.strip() != "true":
        return None, f"{root} is not a git checkout: {_instead(ref)}"
    sha = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if sha.returncode:
        return None, f"commit {ref} is not in this checkout (a shallow clone?): {_instead(ref)}"
    sha = sha.stdout.strip()
    if _git(root, "cat-file", "-e", f"{sha}:flowmagic/__init__.py").returncode:
        return None, f"commit {ref} has no flowmagic/ package: {_instead(ref)}"
    archive = _git(root, "archive", "--format=tar", sha, "flowmagic", text=False)
    if archive.returncode:
        return None, (f"git archive of {ref} failed ({archive.stderr.decode(errors='replace').strip()}): "
                      f"{_instead(ref)}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest, f"flowmagic/ at {ref} ({sha[:10]})"


def _instead(ref: str) -> str:
    return (f"the 'before' runs are not made; give flowmagic/ of {ref} or another older "
            "version with --before DIR")
