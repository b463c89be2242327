"""Where a served benchmark's CPU goes: each process's CPU use over a window, by role (the
engine cores, the HTTP frontends, the bench client and its workers), and the machine's busy
cores. A role whose processes sit near 100 % of a core each, while the engines run fewer
sequences than they could, is what holds the served throughput back.

Reads /proc twice, `--delay` seconds apart (so that a load has ramped up), then over
`--seconds`: utime + stime of every process, divided by the wall time between the reads.
Roles by the name the process gave itself (`openinfer-core`, `openinfer-api`) or by its
command line and ancestors (`openinfer_server.cli bench`, whose spawned workers count with it).

Usage: python process_cpu.py [--delay 20] [--seconds 20] [--json F]"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict

TICKS = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[str, int, int, str]]:
    """{pid: (comm, ppid, cpu ticks, command line)} of every readable process."""
    found: dict[int, tuple[str, int, int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone in between
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        # fields[1] is ppid; utime and stime are stat's fields 14 and 15 (1-based).
        found[int(entry)] = (comm, int(fields[1]), int(fields[11]) + int(fields[12]), cmdline)
    return found


def _busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def _role(pid: int, procs: dict[int, tuple[str, int, int, str]]) -> str:
    comm, _, _, cmdline = procs[pid]
    if comm.startswith("openinfer-core"):
        return "engine"
    if comm.startswith("openinfer-api"):
        return "frontend"
    seen = 0
    while pid in procs and seen < 16:  # the bench client or one of its workers
        if "openinfer_server.cli bench" in procs[pid][3] or " bench serve" in procs[pid][3]:
            return "bench client"
        pid, seen = procs[pid][1], seen + 1
    if "openinfer_server.cli serve" in cmdline:
        return "server (supervisor)"
    return "other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--delay", type=float, default=20.0, help="seconds before the window")
    p.add_argument("--seconds", type=float, default=20.0, help="the window's length")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    time.sleep(args.delay)
    before, busy0, wall0 = _processes(), _busy_ticks(), time.monotonic()
    time.sleep(args.seconds)
    after, busy1, wall1 = _processes(), _busy_ticks(), time.monotonic()
    wall = wall1 - wall0
    per_role: dict[str, list[float]] = defaultdict(list)
    for pid, (_, _, ticks, _) in after.items():
        # A process started within the window (the bench client's workers, spawned once its
        # warmup is done) counts all its ticks.
        share = (ticks - (before[pid][2] if pid in before else 0)) / TICKS / wall
        if share > 0.01:
            per_role[_role(pid, after)].append(share)
    cores = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]) * (os.cpu_count() or 1)
    report = {"window_s": round(wall, 1), "busy_cores": round(cores, 2),
              "cpus": os.cpu_count(), "roles": {}}
    print(f"CPU over {wall:.0f} s: {cores:.1f} of {os.cpu_count()} cores busy")
    for role, shares in sorted(per_role.items(), key=lambda kv: -sum(kv[1])):
        shares.sort(reverse=True)
        report["roles"][role] = {"processes": len(shares), "cores": round(sum(shares), 2),
                                 "busiest": round(shares[0], 2)}
        print(f"  {role:20s} {len(shares):3d} processes, {sum(shares):5.2f} cores, "
              f"busiest {shares[0] * 100:4.0f} % of a core")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
