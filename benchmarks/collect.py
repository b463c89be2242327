"""Fold one GPU run's output folder (what benchmarks/device/gpu_check.sh wrote under $OUT) into
one file under benchmarks/results/. Per-request and per-token lists are dropped to keep it small.
Usage: python benchmarks/collect.py OUT_DIR NAME --commit C --stages 'S ...' [--note TEXT]"""

from __future__ import annotations

import argparse
import json
import re
import tarfile
import tempfile
from pathlib import Path

TABLE_LOGS = {"dsv4-gemm.log", "dsv4-mhc.log"}
DROP = {"ttfts", "itls", "e2els", "input_lens", "output_lens", "errors", "latencies",
        "start_times"}


def slim(value: object) -> object:
    if isinstance(value, dict):
        return {k: slim(v) for k, v in value.items() if k not in DROP}
    if isinstance(value, list):
        return [slim(v) for v in value]
    return value


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("name")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--stages", required=True, help="the stages gpu_check.sh was given")
    args = ap.parse_args()
    out = Path(args.out)
    archive = out / "openinfer-results.tgz"  # gpu_check.sh packs more than 8 files into one
    if archive.is_file():
        unpacked = Path(tempfile.mkdtemp())
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
        out = unpacked
    run: dict[str, object] = {
        "commit": args.commit, "note": args.note,
        "command": f"bash benchmarks/device/gpu_check.sh {args.stages}"}
    gpu = out / "gpu.txt"
    run["gpu"] = gpu.read_text().strip() if gpu.is_file() else None
    for path in sorted(out.iterdir()):
        if path.suffix == ".json":
            run[path.stem] = slim(json.loads(path.read_text()))
        elif path.suffix == ".jsonl":
            run[path.stem] = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        elif (path.name.startswith(("kernel_tests", "golden_tests", "flashinfer_tests",
                                    "dsv4_kernel_tests", "dsv4_golden", "dsv4_official_golden",
                                    "dsv4_mhc_tests", "dsv4_moe_tests", "fp8serve_tests",
                                    "gate_kernel_tests"))
              and path.suffix == ".log"):
            run[path.stem] = (path.read_text().strip().splitlines() or [""])[-1]
        elif path.name in TABLE_LOGS or path.name.startswith(("dsv4-moe-sweep",
                                                               "dsv4-moe-grouped")):
            # printed tables, kept whole
            run[path.stem] = path.read_text().strip().splitlines()
    text = json.dumps(run, indent=1) + "\n"
    for path in out.iterdir():  # the device's own folder is no one's business: write $OUT
        text = re.sub(r'"/[^"]*/' + re.escape(path.name) + '"', f'"$OUT/{path.name}"', text)
    dest = Path(__file__).parent / "results" / f"{args.name}.json"
    dest.write_text(text)
    print(dest, dest.stat().st_size)


if __name__ == "__main__":
    main()
