"""The one runner of the kernel benchmarks: every registered op (`--ops a,b` for some) at each
of its cases through each implementation, checked against the package's reference, timed, and
set beside the floor of its work at the ceilings measured in the same run. One row per op x
case x implementation x side, as JSON (`--json`) and CSV (`--csv`); a short table last.

A/B: `--base COMMIT` builds COMMIT's wheels into .ab-base with benchmarks/device/ab_base.sh
(needs git and uv: a machine with both and a GPU), then runs as `--base-dir .ab-base`;
`--base-dir DIR` takes them built (ab_base.sh run before) or a folder they are installed in.
Each op then runs in fresh interpreters, base and new interleaved `--rounds` times, the base's
openinfer packages first on its PYTHONPATH.

Usage: python -m benchmarks.ops.run [--list] [--ops a,b] [--cases SUBSTR] [--sweep]
       [--base COMMIT | --base-dir DIR] [--rounds N] [--json OUT] [--csv OUT]"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: the repo root is what resolves `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.ops import attention, gemm, sampling  # noqa: F401  (they register the ops)
from benchmarks.ops.registry import Call, Op, Work, select

ROOT = Path(__file__).resolve().parents[2]
Row = dict[str, Any]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops.run",
                                description=__doc__.splitlines()[0])
    p.add_argument("--list", action="store_true", help="print the registered ops and exit")
    p.add_argument("--ops", help="comma-separated op names (default: all)")
    p.add_argument("--cases", help="only the cases whose label contains this")
    p.add_argument("--sweep", action="store_true",
                   help="also every launch setting the op sweeps (tile searches)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the comparison with the reference")
    base = p.add_mutually_exclusive_group()
    base.add_argument("--base", metavar="COMMIT",
                      help="A/B against COMMIT, built here into .ab-base (ab_base.sh)")
    base.add_argument("--base-dir", type=Path, metavar="DIR",
                      help="A/B against the openinfer wheels (or packages) in DIR")
    p.add_argument("--rounds", type=int, default=2, help="A/B: base/new rounds per op")
    p.add_argument("--json", type=Path, help="write the machine and the rows here")
    p.add_argument("--csv", type=Path, help="write the rows here")
    # A/B children: which side this interpreter times, and where its rows go.
    p.add_argument("--side", default="new", help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--rows-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


# --- one op in this interpreter ------------------------------------------------------------


def run_op(op: Op, ceiling: Any, *, side: str = "new", round_: int = 0, sweep: bool = False,
           check: bool = True, cases: str | None = None,
           timer: Callable[[str, Sequence[Call]], float] | None = None) -> list[Row]:
    """Every case x implementation of `op` in this interpreter: its rows, errors included
    (an implementation that fails to launch, or disagrees with the reference). `timer`:
    timing.time_us unless given."""
    import torch

    if timer is None:
        from benchmarks.ops.timing import time_us as timer

    # An implementation may change torch's process-wide BLAS preference (prefill_linear's
    # cublaslt rows): it is set back after each one, so no later row runs on it by accident.
    blas = torch.backends.cuda.preferred_blas_library()
    rows: list[Row] = []
    for case in op.cases:
        if cases and cases not in case.label:
            continue
        copies = op.build(case)
        impls = dict(op.impls)
        swept = set()
        if sweep and op.sweep is not None:
            extra = op.sweep(case)
            swept = set(extra)
            impls.update(extra)
        want = op.reference(copies[0]) if check and op.reference is not None else None
        work = op.work(case)
        for name, impl in impls.items():
            row: Row = {"op": op.name, "case": case.label, "impl": name, "side": side,
                        "round": round_, "timing": op.timing, "sweep": name in swept,
                        **case.params, "flops": work.flops, "bytes": work.bytes}
            try:
                calls = [impl(c) for c in copies]
                if calls[0] is None:
                    continue
                if want is not None:
                    compare(calls[0](), want, op.tolerance)
                us = timer(op.timing, calls)  # type: ignore[arg-type]
            except Exception as e:  # a launch out of resources, a mismatch: a row that says so
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                rows.append(row)
                continue
            finally:
                if torch.backends.cuda.preferred_blas_library() != blas:
                    torch.backends.cuda.preferred_blas_library(blas)
            rows.append({**row, **rates(us, work, ceiling)})
        del copies, want
        torch.cuda.empty_cache()
    return rows


def compare(got: object, want: object, tolerance: tuple[float, float]) -> None:
    import torch

    if isinstance(want, tuple | list):
        assert isinstance(got, tuple | list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            compare(g, w, tolerance)
        return
    assert isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
    rtol, atol = tolerance
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


def rates(us: float, work: Work, ceiling: Any) -> Row:
    """A time and what it is against the work and the ceilings (`ceiling`: read_gbps and
    matmul_tflops, or None)."""
    out: Row = {"us": us, "tflops": work.flops / us / 1e6 if work.flops else None,
                "gbps": work.bytes / us / 1e3 if work.bytes else None}
    if ceiling is not None and (work.flops or work.bytes):
        floor = work.floor_us(ceiling.read_gbps, ceiling.matmul_tflops)
        out.update(floor_us=floor, x_floor=us / floor)
    return out


def machine(ceiling: Any) -> Row:
    import torch
    import triton

    info: Row = {"torch": torch.__version__, "triton": triton.__version__,
                 "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    if ceiling is not None:
        info.update(read_gbps=ceiling.read_gbps, matmul_tflops=ceiling.matmul_tflops)
    return info


def run_here(args: argparse.Namespace, ops: list[Op]) -> tuple[Row, list[Row]]:
    import torch

    from openinfer_server.bench.ceiling import measure_ceiling

    ceiling = measure_ceiling(torch.device("cuda"))
    rows = [r for op in ops for r in run_op(op, ceiling, side=args.side, round_=args.round,
                                              sweep=args.sweep, check=args.check,
                                              cases=args.cases)]
    return machine(ceiling), rows


# --- A/B: each op in fresh interpreters, base and new interleaved ---------------------------


def child_argv(args: argparse.Namespace, op: str, side: str, round_: int, rows_out: Path
               ) -> list[str]:
    argv = [sys.executable, "-m", "benchmarks.ops.run", "--ops", op, "--side", side,
            "--round", str(round_), "--rows-out", str(rows_out)]
    if args.cases:
        argv += ["--cases", args.cases]
    if args.sweep:
        argv.append("--sweep")
    if not args.check:
        argv.append("--no-check")
    return argv


def side_envs(base_site: Path) -> dict[str, dict[str, str]]:
    """Each side's environment: the base's packages ahead of everything else on the path."""
    new = dict(os.environ)
    base = dict(os.environ)
    base["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(base_site), os.environ.get("PYTHONPATH", "")) if p)
    return {"base": base, "new": new}


def run_ab(args: argparse.Namespace, ops: list[Op], work: Path) -> tuple[Row, list[Row]]:
    from benchmarks.ops.base import build_base, site_of

    wheels = build_base(args.base) if args.base else args.base_dir
    site = site_of(wheels, work / "site")
    envs = side_envs(site)
    info: Row = {}
    commit = wheels / "COMMIT"
    if commit.is_file():
        info["base_commit"] = commit.read_text().strip()
    rows: list[Row] = []
    for op in ops:
        for round_ in range(args.rounds):
            for side in ("base", "new"):
                out = work / f"{op.name}-{side}-{round_}.json"
                done = subprocess.run(child_argv(args, op.name, side, round_, out),
                                      env=envs[side], cwd=ROOT)
                if done.returncode != 0 or not out.is_file():
                    rows.append({"op": op.name, "side": side, "round": round_,
                                 "error": f"exit {done.returncode}"})
                    continue
                child = json.loads(out.read_text())
                info.setdefault(f"machine_{side}", child["machine"])
                rows += child["rows"]
    return info, rows


# --- output ----------------------------------------------------------------------------------


def write_csv(path: Path, rows: list[Row]) -> None:
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def table(rows: list[Row]) -> list[str]:
    """Per op x case x implementation the median time of each side (and new over base); of a
    sweep's settings only the fastest."""
    times: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    best: dict[tuple[str, str, str], str] = {}
    errors = []
    for r in rows:
        if "error" in r:
            if not r.get("sweep"):
                errors.append(f"{r['op']} {r.get('case', '')} {r.get('impl', '')} "
                              f"{r['side']}: {r['error']}")
            continue
        if not r["sweep"]:
            key = (r["op"], r["case"], r["impl"])
            times.setdefault(key, {}).setdefault(r["side"], []).append(r["us"])
            continue
        key = (r["op"], r["case"], "sweep")
        fastest = times.setdefault(key, {}).get(r["side"])
        if fastest is None or r["us"] < fastest[0]:
            times[key][r["side"]] = [r["us"]]
            if r["side"] == "new":
                best[key] = r["impl"]
    floors = {(r["op"], r["case"]): r["floor_us"] for r in rows if r.get("floor_us")}
    nan = float("nan")
    lines = [f"{'op':22s} {'case':20s} {'impl':30s} {'us':>9s} {'x floor':>7s} "
             f"{'base us':>9s} {'new/base':>8s}"]
    for key, sides in times.items():
        op, case, impl = key
        new = statistics.median(sides["new"]) if "new" in sides else nan
        base = statistics.median(sides["base"]) if "base" in sides else nan
        floor = floors.get((op, case), nan)
        name = f"best: {best.get(key, '?')}" if impl == "sweep" else impl
        lines.append(f"{op:22s} {case:20s} {name[:30]:30s} {new:9.1f} {new / floor:7.2f} "
                     f"{base:9.1f} {new / base:8.3f}")
    return lines + [f"error: {e}" for e in errors]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for op in select(None):
            print(f"{op.name:24s} {len(op.cases):3d} cases  {', '.join(op.impls)}"
                  f"{'  (+ --sweep)' if op.sweep else ''}\n    {op.doc}")
        return 0
    ops = select(args.ops)
    if args.base or args.base_dir:
        with tempfile.TemporaryDirectory(prefix="openinfer-ab-") as work:
            info, rows = run_ab(args, ops, Path(work))
    else:
        info, rows = run_here(args, ops)
    if args.rows_out:  # an A/B child: the parent prints and writes
        args.rows_out.write_text(json.dumps({"machine": info, "rows": rows}))
        return 0
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "ops": [op.name for op in ops],
                                         "rows": rows}, indent=1) + "\n")
    if args.csv:
        write_csv(args.csv, rows)
    print("\n".join(table(rows)))
    mismatches = [r for r in rows if "AssertionError" in r.get("error", "")]
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

