"""benchmarks/ops: the op registry and the runner's logic that needs no GPU (registration, the
A/B's arguments, interleaving and environments, the baseline's wheels, rows and the table)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.ops import base, registry, run  # noqa: E402
from benchmarks.ops.registry import Case, Op, Work  # noqa: E402


def test_every_op_module_registers_its_ops() -> None:
    names = registry.list_ops()
    for name in ("paged_decode", "prefill_attention", "mixed_step_attention",
                 "attention_backends", "small_linear", "linear_add_norm", "prefill_linear",
                 "residual_add_norm", "lm_head", "sampling"):
        assert name in names
    assert [op.name for op in registry.select("lm_head, paged_decode")] == ["lm_head",
                                                                            "paged_decode"]
    assert [op.name for op in registry.select("all")] == names
    assert [op.name for op in registry.select(None)] == names


def test_an_unknown_op_names_the_registered_ones() -> None:
    with pytest.raises(KeyError, match="no op 'nope'; registered: attention_backends"):
        registry.get_op("nope")


def test_register_op_refuses_a_second_op_of_a_name_and_repeated_cases(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_OPS", {})
    fields: dict[str, Any] = dict(doc="", build=lambda c: [None], impls={},
                                  work=lambda c: Work())
    registry.register_op("a", cases=[Case("x")], **fields)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register_op("a", cases=[Case("x")], **fields)
    with pytest.raises(ValueError, match="case labels repeat"):
        registry.register_op("b", cases=[Case("x"), Case("x")], **fields)
    assert registry.list_ops() == ["a"]


def test_the_floor_is_the_roofline_of_the_work() -> None:
    # 1 GB at 2000 GB/s is 500 us; 1 TFLOP at 500 TFLOP/s is 2000 us: the larger wins.
    assert Work(flops=1e12, bytes=1e9).floor_us(2000, 500) == pytest.approx(2000)
    assert Work(bytes=1e9).floor_us(2000, 500) == pytest.approx(500)


class FakeCeiling:
    read_gbps = 2000.0
    matmul_tflops = 500.0


def _op(**overrides: Any) -> Op:
    fields: dict[str, Any] = dict(
        name="scale", doc="", cases=(Case("n4", {"n": 4}), Case("n8", {"n": 8})),
        build=lambda c: [torch.ones(c.params["n"])],
        impls={"good": lambda x: lambda: x * 2, "bad": lambda x: lambda: x * 3,
               "absent": lambda x: None},
        work=lambda c: Work(flops=c.params["n"], bytes=4e6 * c.params["n"]),
        timing="events", reference=lambda x: x * 2, tolerance=(0.0, 0.0),
        sweep=lambda c: {"tile-a": lambda x: lambda: x + x}, )
    fields.update(overrides)
    return Op(**fields)


def test_run_op_checks_against_the_reference_and_writes_a_row_per_case_and_impl() -> None:
    timed: list[str] = []

    def timer(timing: str, calls: Any) -> float:
        timed.append(timing)
        return 10.0

    rows = run.run_op(_op(), FakeCeiling(), side="base", round_=1, sweep=True, timer=timer)
    assert [(r["case"], r["impl"]) for r in rows] == [
        ("n4", "good"), ("n4", "bad"), ("n4", "tile-a"),
        ("n8", "good"), ("n8", "bad"), ("n8", "tile-a")]  # "absent" applies to no case
    good, bad, swept = rows[:3]
    assert good["us"] == 10.0 and good["side"] == "base" and good["round"] == 1
    assert good["n"] == 4 and not good["sweep"] and swept["sweep"]
    assert good["gbps"] == pytest.approx(16e6 / 10 / 1e3)
    assert good["floor_us"] == pytest.approx(16e6 / 2000e3)
    assert good["x_floor"] == pytest.approx(10 / good["floor_us"])
    assert "us" not in bad and bad["error"].startswith("AssertionError")
    assert timed == ["events"] * 4  # the mismatches are never timed
    only_n8 = run.run_op(_op(), None, cases="n8", check=False, timer=timer)
    assert [r["impl"] for r in only_n8] == ["good", "bad"]  # no sweep, no check
    assert "floor_us" not in only_n8[0]  # no ceiling, no floor


def test_run_op_sets_the_blas_preference_back_after_each_impl() -> None:
    # prefill_linear's impls set torch's process-wide preference: no later row may inherit it.
    before = torch.backends.cuda.preferred_blas_library()
    seen = []

    def lt(x: Any) -> Any:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        return lambda: x * 2

    def plain(x: Any) -> Any:
        seen.append(torch.backends.cuda.preferred_blas_library())
        return lambda: x * 2

    op = _op(impls={"lt": lt, "plain": plain}, sweep=None)
    rows = run.run_op(op, None, timer=lambda t, c: 1.0)
    assert len(rows) == 4 and seen == [before, before]
    assert torch.backends.cuda.preferred_blas_library() == before


def test_the_runner_exits_1_on_a_mismatch(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.setattr(run, "run_here", lambda args, ops: (
        {}, run.run_op(_op(), None, timer=lambda t, c: 1.0)))
    assert run.main(["--ops", "lm_head", "--json", str(tmp_path / "r.json")]) == 1
    assert len(json.loads((tmp_path / "r.json").read_text())["rows"]) == 4


def test_base_and_base_dir_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--base", "main", "--base-dir", "x"])
    assert "not allowed with argument" in capsys.readouterr().err
    args = run.parse_args(["--base-dir", ".ab-base", "--ops", "lm_head", "--rounds", "3"])
    assert args.base_dir == Path(".ab-base") and args.rounds == 3 and args.base is None


def test_ab_interleaves_base_and_new_in_fresh_interpreters(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "COMMIT").write_text("abc1234\n")
    monkeypatch.setattr(base, "site_of", lambda folder, into: tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", "/shared")
    calls = []

    def fake_run(argv: list[str], env: dict[str, str], cwd: Path) -> Any:
        at = argv.index("--rows-out")
        side, round_ = argv[argv.index("--side") + 1], int(argv[argv.index("--round") + 1])
        calls.append((argv[argv.index("--ops") + 1], side, round_, env["PYTHONPATH"]))
        row = {"op": "x", "case": "c", "impl": "i", "side": side, "round": round_,
               "sweep": False, "us": 2.0 if side == "new" else 4.0}
        Path(argv[at + 1]).write_text(json.dumps({"machine": {"gpu": "G"}, "rows": [row]}))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(run.subprocess, "run", fake_run)
    args = run.parse_args(["--ops", "lm_head,sampling", "--base-dir", str(wheels), "--sweep"])
    info, rows = run.run_ab(args, registry.select(args.ops), tmp_path)
    base_path = f"{tmp_path / 'site'}:/shared"
    assert calls == [("lm_head", "base", 0, base_path), ("lm_head", "new", 0, "/shared"),
                     ("lm_head", "base", 1, base_path), ("lm_head", "new", 1, "/shared"),
                     ("sampling", "base", 0, base_path), ("sampling", "new", 0, "/shared"),
                     ("sampling", "base", 1, base_path), ("sampling", "new", 1, "/shared")]
    assert info["base_commit"] == "abc1234" and info["machine_base"] == {"gpu": "G"}
    assert len(rows) == 8
    argv = run.child_argv(args, "lm_head", "new", 0, tmp_path / "o.json")
    assert argv[1:3] == ["-m", "benchmarks.ops.run"] and "--sweep" in argv
    line = next(x for x in run.table(rows) if x.startswith("x "))
    assert line.split()[-4:] == ["2.0", "nan", "4.0", "0.500"]


def test_base_commit_builds_with_ab_base_sh_then_runs_as_base_dir(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    built = []
    monkeypatch.setattr(base.subprocess, "run",
                        lambda argv, cwd, check: built.append((argv, cwd, check)))
    assert base.build_base("abc1234") == ROOT / ".ab-base"
    assert built == [(["bash", str(ROOT / "benchmarks" / "device" / "ab_base.sh"), "abc1234"],
                      ROOT, True)]
    wheels = tmp_path / "ab-base"
    wheels.mkdir()
    (wheels / "COMMIT").write_text("abc1234\n")
    asked = []
    monkeypatch.setattr(base, "build_base", lambda commit: asked.append(commit) or wheels)
    monkeypatch.setattr(base, "site_of", lambda folder, into: asked.append(folder) or into)
    args = run.parse_args(["--ops", "lm_head", "--base", "main", "--rounds", "1"])
    monkeypatch.setattr(run.subprocess, "run",
                        lambda argv, env, cwd: subprocess.CompletedProcess(argv, 1))
    info, rows = run.run_ab(args, registry.select(args.ops), tmp_path)
    assert asked == ["main", wheels] and info["base_commit"] == "abc1234"
    assert [r["error"] for r in rows] == ["exit 1", "exit 1"]


def test_the_table_keeps_the_fastest_of_a_sweep_and_lists_errors() -> None:
    rows = [{"op": "o", "case": "c", "impl": f"tile{i}", "side": "new", "sweep": True,
             "us": us, "floor_us": 1.0} for i, us in enumerate((5.0, 3.0, 4.0))]
    rows += [{"op": "o", "case": "c", "impl": "tile9", "side": "new", "sweep": True,
              "error": "OutOfResources"},
             {"op": "o", "case": "c", "impl": "engine", "side": "new", "sweep": False,
              "error": "AssertionError: mismatch"}]
    lines = run.table(rows)
    assert any("best: tile1" in x and " 3.0 " in x and "3.00" in x for x in lines)
    assert lines[-1] == "error: o c engine new: AssertionError: mismatch"
    assert not any("OutOfResources" in x for x in lines)  # a tile that does not fit is no news


def test_rows_go_to_csv_with_every_field(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    run.write_csv(path, [{"op": "a", "us": 1.5}, {"op": "b", "error": "E", "n": 3}])
    assert path.read_text().splitlines() == ["op,us,error,n", "a,1.5,,", "b,,E,3"]


def test_the_baseline_is_its_wheels_unpacked(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "openinfer_x-0.1-py3-none-any.whl", "w") as z:
        z.writestr("openinfer_x/__init__.py", "VERSION = 'base'\n")
        z.writestr("openinfer_x-0.1.dist-info/METADATA", "Name: openinfer-x\n")
        z.writestr("openinfer_x-0.1.data/purelib/openinfer_x/extra.py", "")
        z.writestr("openinfer_x-0.1.data/scripts/tool", "")
    site = base.site_of(wheels, tmp_path / "site")
    assert (site / "openinfer_x" / "__init__.py").read_text() == "VERSION = 'base'\n"
    assert (site / "openinfer_x" / "extra.py").is_file()
    assert not (site / "tool").exists() and not (site / "openinfer_x-0.1.data").exists()
    assert base.site_of(site, tmp_path / "unused") == site  # packages already: used as is
    with pytest.raises(SystemExit, match="neither openinfer wheels nor packages"):
        base.site_of(tmp_path / "site" / "openinfer_x-0.1.dist-info", tmp_path / "s2")
