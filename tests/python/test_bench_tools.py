"""bench/ab_table.py: the table of an A/B or variants run (no GPU needed)."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "bench", "ab_table.py")

RUN = """== build-gpu/bench_gdnkit (round 1)
row                                      tokens  device_ms    host_us kernel
fixed-b1-t16384                           16384     0.8000       5.33 cuda-fused-sm90-bf16-k128-v64
fixed-b2-t512                              1024     0.0500       5.71 cuda-fused-sm90-bf16-k128
== build-gpu/variant-s64/bench_gdnkit (round 1)
row                                      tokens  device_ms    host_us kernel
fixed-b1-t16384                           16384     0.7000       5.18 cuda-fused-sm90-bf16-k128-v64
fixed-b2-t512                              1024     0.0550       5.54 cuda-fused-sm90-bf16-k128
== build-gpu/bench_gdnkit (round 2)
row                                      tokens  device_ms    host_us kernel
fixed-b1-t16384                           16384     0.8200       5.33 cuda-fused-sm90-bf16-k128-v64
fixed-b2-t512                              1024     0.0500       5.71 cuda-fused-sm90-bf16-k128
== build-gpu/variant-s64/bench_gdnkit (round 2)
row                                      tokens  device_ms    host_us kernel
fixed-b1-t16384                           16384     0.7100       5.18 cuda-fused-sm90-bf16-k128-v64
"""


def table(tmp_path, *args):
    f = tmp_path / "variants.txt"
    f.write_text(RUN)
    return subprocess.run([sys.executable, TOOL, str(f), *args], capture_output=True, text=True)


def test_changes_against_the_default_build(tmp_path):
    r = table(tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[-2:] == ["this", "s64"]
    row = {l.split()[0]: l for l in lines[1:]}
    # (0.70 + 0.71) / 2 against (0.80 + 0.82) / 2: -13.0%
    assert "0.8000/0.8200" in row["fixed-b1-t16384"] and "0.7000/0.7100 -13.0%" in row["fixed-b1-t16384"]
    # a side missing from a round is averaged over the rounds it has: 0.055 against 0.05
    assert "0.0550 +10.0%" in row["fixed-b2-t512"]


def test_another_reference_and_a_bad_one(tmp_path):
    r = table(tmp_path, "--ref", "s64")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[-2:] == ["s64", "this"]
    assert "+14.9%" in r.stdout  # 0.81 against 0.705
    bad = table(tmp_path, "--ref", "nope")
    assert bad.returncode != 0 and "--ref nope" in bad.stderr and "this, s64" in bad.stderr


def test_medians_by_default_means_on_request(tmp_path):
    # One slow round of the variant (a clock dip, a neighbour): the median ignores it, the mean not.
    run = "".join(
        f"""== /tmp/gdnkit-drivers/{side}/bench_gdnkit (round {r})
row                                      tokens  device_ms    host_us kernel plan_us
fixed-b1-t4096                             4096     {ms}       5.33 cuda-fused-sm90-bf16-k128-v64 1.20
"""
        for r, pair in enumerate(((0.1000, 0.0900), (0.1000, 0.0900), (0.1000, 0.1500)), 1)
        for side, ms in (("this", "%.4f" % pair[0]), ("alt", "%.4f" % pair[1])))
    f = tmp_path / "drivers.txt"
    f.write_text(run)
    median = subprocess.run([sys.executable, TOOL, str(f)], capture_output=True, text=True)
    assert median.returncode == 0, median.stderr
    assert "0.0900/0.0900/0.1500 -10.0%" in median.stdout, median.stdout  # 0.09 against 0.10
    mean = subprocess.run([sys.executable, TOOL, str(f), "--mean"], capture_output=True, text=True)
    assert mean.returncode == 0, mean.stderr
    assert "0.0900/0.0900/0.1500 +10.0%" in mean.stdout, mean.stdout  # 0.11 against 0.10


def test_rows_with_the_planning_column_and_carried_drivers(tmp_path):
    # Newer drivers print plan_us after the kernel; gpu_check.sh's drivers stage names a side by
    # the folder it unpacked the driver into.
    run = """== /tmp/gdnkit-drivers/this/bench_gdnkit (round 1)
row                                      tokens  device_ms    host_us kernel plan_us
qwen35tp8-2x8-b1-t32768                   32768     0.3200      10.51 cuda-fused-sm90-bf16-k128-cp8 1.71
== /tmp/gdnkit-drivers/bsw/bench_gdnkit (round 1)
row                                      tokens  device_ms    host_us kernel plan_us
qwen35tp8-2x8-b1-t32768                   32768     0.3040      10.56 cuda-fused-sm90-bf16-k128-cp8 1.77
"""
    f = tmp_path / "drivers.txt"
    f.write_text(run)
    r = subprocess.run([sys.executable, TOOL, str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[-2:] == ["this", "bsw"]
    assert "cuda-fused-sm90-bf16-k128-cp8" in lines[1] and "0.3040 -5.0%" in lines[1]


def test_drivers_stage_alternates_the_order_of_its_sides(tmp_path):
    # gpu_check.sh's drivers stage with two stand-in drivers: every side once per round, even
    # rounds in reverse order, and the table against "this".
    import shutil

    if shutil.which("xz") is None:
        import pytest

        pytest.skip("xz not installed")
    drivers = tmp_path / "drivers"
    drivers.mkdir()
    for name, ms in (("alt", "0.0450"), ("this", "0.0500")):
        script = tmp_path / name
        script.write_text(
            "#!/bin/sh\n"
            "echo 'row                                      tokens  device_ms    host_us kernel plan_us'\n"
            f"echo 'fixed-b2-t512                              1024     {ms}       5.71 cuda-fused-sm90-bf16-k128 1.20'\n"
        )
        with open(drivers / f"{name}.xz", "wb") as f:
            subprocess.run(["xz", "-c", str(script)], stdout=f, check=True)
    out = tmp_path / "out"
    # (PACK_OUT cleared: a gpu_check.sh run with PACK_OUT=1 around this test would pack drivers.txt away.)
    env = dict(os.environ, OUT=str(out), STAGES="drivers", DRIVERS=str(drivers), AB_ROUNDS="3", PY=sys.executable,
               PACK_OUT="0")
    script = os.path.join(HERE, "..", "..", "scripts", "gpu_check.sh")
    r = subprocess.run(["bash", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    heads = [line.split("/")[-2] + " " + line.split()[-1] for line in (out / "drivers.txt").read_text().splitlines()
             if line.startswith("== ")]
    assert heads == ["alt 1)", "this 1)", "this 2)", "alt 2)", "alt 3)", "this 3)"], heads
    rows = (out / "drivers-table.txt").read_text().splitlines()
    assert rows[0].split()[-2:] == ["this", "alt"], rows
    assert "0.0450/0.0450/0.0450 -10.0%" in rows[1], rows
