#!/usr/bin/env python3
"""Distributed profiling end to end (ctest label "mpi"): `mpirun -np 3 kareus optimize --mpi`.

1. The 3-rank run writes the same frontier.json and plans as a single-process run (byte for
   byte, except the wall-clock "seconds" field).
2. A 3-rank run killed with SIGKILL (the whole job) once the store holds some rows, then rerun
   with the same store: the rerun measures exactly the points the store lacked (measured ==
   total - rows at the kill, reused == rows) and again gives the same frontier.
"""
import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time


def mpi_env():
    env = dict(os.environ)
    if os.getuid() == 0:  # OpenMPI refuses root unless told twice
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    # Loopback only: a CI container may have no usable network interface for the TCP BTL.
    env.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")
    env.setdefault("OMPI_MCA_oob_tcp_if_include", "lo")
    # Under the sanitizer build: OpenMPI keeps allocations past MPI_Finalize by design.
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    return env


def optimize_args(a, out, db, extra=()):
    return [a.kareus, "optimize", a.workload, "--out", out, "--db", db, "--quiet", "--json",
            "--budget", str(a.budget)] + list(extra)


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)


def mpirun(n):
    return [shutil.which("mpirun") or "mpirun", "-np", str(n), "--oversubscribe"]


# Wall time and the measured/reused split (a resumed run reuses) are not part of the result.
RUN_FIELDS = {"seconds", "measured", "reused", "resumed"}


def without_seconds(x):
    if isinstance(x, dict):
        return {k: without_seconds(v) for k, v in x.items() if k not in RUN_FIELDS}
    if isinstance(x, list):
        return [without_seconds(v) for v in x]
    return x


def same_outputs(a_dir, b_dir, what):
    fa = json.load(open(os.path.join(a_dir, "frontier.json")))
    fb = json.load(open(os.path.join(b_dir, "frontier.json")))
    if without_seconds(fa) != without_seconds(fb):
        sys.exit(f"FAIL: {what}: frontier.json differs from the single-process run")
    plans = sorted(os.listdir(os.path.join(a_dir, "plans")))
    if not plans or plans != sorted(os.listdir(os.path.join(b_dir, "plans"))):
        sys.exit(f"FAIL: {what}: plan files differ: {plans}")
    for p in plans:
        if open(os.path.join(a_dir, "plans", p), "rb").read() != open(
                os.path.join(b_dir, "plans", p), "rb").read():
            sys.exit(f"FAIL: {what}: plans/{p} differs")


def rows(db):
    try:
        c = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        n = c.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
        c.close()
        return n
    except sqlite3.Error:
        return 0


def descendants(pid):
    """pid and every process below it (OpenMPI may put ranks in process groups of their own)."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def kill_job(job):
    for p in descendants(job.pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kareus", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--budget", type=int, default=16)
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    w = lambda *p: os.path.join(a.workdir, *p)
    env = mpi_env()

    single = run(optimize_args(a, w("single"), w("single.db")))
    total = single["profiling"]["measured"]
    if total < 50 or single["profiling"]["reused"] != 0:
        sys.exit(f"FAIL: single-process run profiled {single['profiling']}")

    # 1. Three ranks: rank 0 searches, ranks 1 and 2 measure.
    three = run(mpirun(3) + optimize_args(a, w("three"), w("three.db"), ["--mpi"]), env)
    if three["profiling"]["measured"] != total or three["profiling"]["reused"] != 0:
        sys.exit(f"FAIL: 3 ranks profiled {three['profiling']}, single process {total} points")
    same_outputs(w("single"), w("three"), "3 ranks")
    if rows(w("three.db")) != total:
        sys.exit(f"FAIL: 3-rank store has {rows(w('three.db'))} rows, expected {total}")
    print(f"ok: 3 ranks, {total} points, same frontier and plans as one process")

    # 2. Kill -9 the whole job once a third of the points are stored, then resume.
    cmd = mpirun(3) + optimize_args(a, w("killed"), w("resume.db"),
                                    ["--mpi", "--emulate-profiling-delay-ms", "20"])
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                           start_new_session=True)
    deadline = time.time() + 300
    while rows(w("resume.db")) < total // 3:
        if job.poll() is not None:
            sys.exit("FAIL: the job to be killed ended before a third of the points were stored")
        if time.time() > deadline:
            kill_job(job)
            sys.exit("FAIL: the job stored too few points in 300 s")
        time.sleep(0.05)
    kill_job(job)  # mpirun and every rank at once, as a scheduler's kill would
    job.wait()
    time.sleep(0.5)
    kept = rows(w("resume.db"))
    if not 0 < kept < total:
        sys.exit(f"FAIL: {kept} rows after the kill, expected between 0 and {total}")
    again = run(mpirun(3) + optimize_args(a, w("resumed"), w("resume.db"), ["--mpi"]), env)
    prof = again["profiling"]
    if prof["reused"] != kept or prof["measured"] != total - kept:
        sys.exit(f"FAIL: the rerun measured {prof['measured']} and reused {prof['reused']}; "
                 f"the store kept {kept} of {total}, so expected {total - kept} and {kept}")
    same_outputs(w("single"), w("resumed"), "resumed run")
    print(f"ok: killed with {kept}/{total} points stored; the rerun measured {total - kept}")


if __name__ == "__main__":
    main()
