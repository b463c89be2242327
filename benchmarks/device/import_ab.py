"""Import time of the engine's modules, A/B: for each side (a folder of installed packages put
first on PYTHONPATH), fresh interpreters time `import openinfer_core.engine.engine,
openinfer_qwen3.model`, the sides interleaved run by run, their order reversed every other run
so that neither side always goes first (an effect of the order would otherwise read as a
difference of the sides); the median per side. One untimed interpreter a side first
writes the bytecode caches, so every timed one finds them.
Usage: python import_ab.py --site base=DIR --site new=DIR [--runs 5] [--json F]"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CODE = ("import time; t=time.perf_counter(); import openinfer_core.engine.engine, "
        "openinfer_qwen3.model; print(time.perf_counter()-t)")


def import_seconds(site: str) -> float:
    env = dict(os.environ, PYTHONPATH=site)
    done = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                          check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--site", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    sites = dict(s.split("=", 1) for s in args.site)
    for site in sites.values():
        import_seconds(site)
    samples: dict[str, list[float]] = {name: [] for name in sites}
    order = list(sites.items())
    for _ in range(args.runs):
        for name, site in order:
            samples[name].append(import_seconds(site))
        order.reverse()
    result = {name: {"site": sites[name], "median_s": statistics.median(times),
                     "samples_s": times} for name, times in samples.items()}
    for name, r in result.items():
        print(f"import {name:6s} median {r['median_s']:.3f} s  "
              f"({', '.join(f'{t:.3f}' for t in r['samples_s'])})")
    if args.json:
        args.json.write_text(json.dumps({"code": CODE, "runs": args.runs, "sides": result},
                                        indent=1))


if __name__ == "__main__":
    main()
