"""The baseline of an A/B (`run.py --base COMMIT` or `--base-dir DIR`): COMMIT's openinfer
wheels, which benchmarks/device/ab_base.sh builds into .ab-base (as for gpu_check.sh's `ab`
stage), unpacked into a folder that goes first on the base side's PYTHONPATH, so its
openinfer packages shadow the tree's while every other package is shared."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AB_BASE_SH = ROOT / "benchmarks" / "device" / "ab_base.sh"


def build_base(commit: str) -> Path:
    """COMMIT's openinfer wheels (and its COMMIT file) in the repo's .ab-base, made by
    ab_base.sh (git and uv needed), which replaces what .ab-base held."""
    subprocess.run(["bash", str(AB_BASE_SH), commit], cwd=ROOT, check=True)
    return ROOT / ".ab-base"


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
