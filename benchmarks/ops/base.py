"""The baseline of an A/B (`run.py --base COMMIT` or `--base-dir DIR`): COMMIT's openinfer
wheels built from a git worktree (as benchmarks/device/ab_base.sh does for gpu_check.sh's
`ab` stage), unpacked into a folder that goes first on the base side's PYTHONPATH, so its
openinfer packages shadow the tree's while every other package is shared."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheels(commit: str, dest: Path) -> Path:
    """COMMIT's openinfer wheels in `dest` (`uv build` in a detached worktree, removed after)."""
    dest.mkdir(parents=True, exist_ok=True)
    tree = Path(tempfile.mkdtemp(prefix="openinfer-base-"))
    tree.rmdir()
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), commit], cwd=ROOT,
                   check=True)
    try:
        subprocess.run(["uv", "build", "-q", "--all-packages", "--wheel", "-o",
                        str(dest.resolve())], cwd=tree, check=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                       check=True)
    sha = subprocess.run(["git", "rev-parse", "--short", commit], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    (dest / "COMMIT").write_text(sha + "\n")
    return dest


def site_of(folder: Path, into: Path) -> Path:
    """A folder to put on PYTHONPATH for the baseline: `folder` itself when it already holds
    packages (gpu_check.sh's /tmp/site-base), else its wheels unpacked into `into`."""
    wheels = sorted(folder.glob("openinfer_*.whl"))
    if not wheels:
        if not any(folder.glob("openinfer_*/__init__.py")):
            raise SystemExit(f"--base-dir {folder}: neither openinfer wheels nor packages")
        return folder
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    for wheel in wheels:
        unpack_wheel(wheel, into)
    return into


def unpack_wheel(wheel: Path, site: Path) -> None:
    """A pure-Python wheel's files into `site`, as an install would lay them out (the
    `.data/purelib` and `.data/platlib` trees at the top; scripts and headers left out)."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            parts = Path(info.filename).parts
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            target = site.joinpath(*parts)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(info))
