"""Kareus installed outside its build tree, the two ways the README gives.

``cmake BUILD``: ``cmake --install BUILD --prefix T``, then T/bin/kareus runs a verb that reads
shipped data (``calibrate --no-fit``: the measurements in share/kareus/data) from a folder
without any, and a C program compiles and runs against T/include and T/lib/libkareus_c.so.

``pip SOURCE``: the tracked files of SOURCE copied to a temporary folder, ``pip install`` of
that copy into a new virtual environment (no system site-packages: torch comes from the
package's dependencies), the copy deleted (so nothing of its build folder can be used), then
``import kareus, kareus.torch, kareus.replan``, the packaged CLI and kareus-freqd found next to
the module, and the ``kareus`` console script. pip fetches scikit-build-core and pybind11 into
its isolated build environment; ccache (CMakeLists.txt) makes the compile a re-use of the
release build's objects.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

C_PROGRAM = r"""
#include <stdio.h>
#include "kareus/c_api.h"
int main(void) {
  printf("kareus %s, plan format %d\n", kareus_version(), kareus_plan_format_version());
  return kareus_plan_format_version() > 0 ? 0 : 1;
}
"""

# What the installed copies must not see: the build tree's module, binaries and overrides.
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "KAREUS_CLI", "KAREUS_FREQD", "KAREUS_DATA_DIR",
                          "VIRTUAL_ENV")}


def run(argv, cwd=None, env=None):
    """Runs argv (never a shell); fails the test with its output when it exits non-zero."""
    start = time.monotonic()
    p = subprocess.run(argv, cwd=cwd, env=env or CLEAN_ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    took = time.monotonic() - start
    print(f"[{took:6.1f} s] {' '.join(argv)}", flush=True)
    if p.returncode != 0:
        sys.exit(f"FAILED (exit {p.returncode}): {' '.join(argv)}\n{p.stdout}")
    return p.stdout


def expect(what, text, needle):
    if needle not in text:
        sys.exit(f"FAILED: {what}: {needle!r} not in the output:\n{text}")


def cmake_install(args, work):
    prefix = os.path.join(work, "prefix")
    run(["cmake", "--install", args.path, "--prefix", prefix])
    kareus = os.path.join(prefix, "bin", "kareus")
    expect("kareus --help", run([kareus, "--help"]), "calibrate")
    empty = os.path.join(work, "elsewhere")
    os.makedirs(empty)
    out = run([kareus, "calibrate", "--no-fit"], cwd=empty)
    expect("calibrate --no-fit", out, "rms relative error")
    for f in ("bin/kareus-freqd", "lib/libkareus_c.so", "include/kareus/c_api.h",
              "share/kareus/workloads/paper", "share/kareus/data/calibration"):
        if not os.path.exists(os.path.join(prefix, f)):
            sys.exit(f"FAILED: {f} not installed under {prefix}")
    src = os.path.join(work, "version.c")
    with open(src, "w") as f:
        f.write(C_PROGRAM)
    exe = os.path.join(work, "version")
    lib = os.path.join(prefix, "lib")
    run([args.cc, *args.cflags.split(), "-std=c99", "-Wall", "-Werror", "-I",
         os.path.join(prefix, "include"), src, "-o", exe, "-L", lib, "-lkareus_c",
         f"-Wl,-rpath,{lib}"])
    expect("C program", run([exe]), "plan format")


def pip_install(args, work):
    copy = os.path.join(work, "src")
    files = subprocess.run(["git", "-C", args.path, "ls-files", "-z"], check=True,
                           stdout=subprocess.PIPE).stdout.decode().split("\0")
    for f in filter(None, files):
        if os.path.isfile(os.path.join(args.path, f)):  # a deleted, not yet committed file
            os.makedirs(os.path.dirname(os.path.join(copy, f)), exist_ok=True)
            shutil.copy2(os.path.join(args.path, f), os.path.join(copy, f))
    venv = os.path.join(work, "v")
    # From a virtual environment, venv builds on the base interpreter (Debian's python3).
    run([sys.executable, "-m", "venv", venv])
    env = dict(CLEAN_ENV)
    # The release preset's generator: ccache's relative paths then match its objects.
    env["CMAKE_GENERATOR"] = "Unix Makefiles"
    # And its compilers: scikit-build-core otherwise takes Python's (x86_64-linux-gnu-g++, the
    # same g++ under another name, which ccache hashes).
    env["CC"], env["CXX"] = args.cc, args.cxx
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    run([os.path.join(venv, "bin", "pip"), "install", "-q", "--disable-pip-version-check",
         copy], env=env)
    shutil.rmtree(copy)
    python = os.path.join(venv, "bin", "python")
    out = run([python, "-c",
               "import os, kareus, kareus.torch, kareus.replan, kareus._core as c\n"
               "pkg = os.path.dirname(kareus.__file__)\n"
               "cli = kareus.replan.find_cli()\n"
               "assert cli == os.path.join(pkg, 'bin', 'kareus'), cli\n"
               "assert os.access(os.path.join(pkg, 'bin', 'kareus-freqd'), os.X_OK)\n"
               "print('torch', kareus.torch.torch.__version__, 'cli', cli)\n"], cwd=work)
    print(out, end="")
    expect("kareus console script", run([os.path.join(venv, "bin", "kareus"), "--help"]),
           "calibrate")
    # The controller finds its kareus-freqd next to the module (dry run: no GPU needed).
    log = os.path.join(work, "freqd.jsonl")
    run([python, "-c",
         "import kareus\n"
         f"with kareus.Controller(dry_run=True, log_path={log!r}) as ctl:\n"
         "    assert ctl.running\n"
         "    ctl.set_clock(1200)\n"], cwd=work)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["cmake", "pip"])
    ap.add_argument("path", help="cmake: the build folder; pip: the source tree")
    ap.add_argument("--cc", default="cc", help="the C compiler (cmake: of the test program)")
    ap.add_argument("--cxx", default="c++", help="pip: the C++ compiler")
    ap.add_argument("--cflags", default="", help="cmake: its extra flags (the sanitizers)")
    args = ap.parse_args()
    # Outside the build folder: a binary there may fall back to the source tree's data.
    work = tempfile.mkdtemp(prefix=f"kareus-{args.mode}-install-")
    print(f"working in {work} (removed on success)")
    start = time.monotonic()
    (cmake_install if args.mode == "cmake" else pip_install)(args, work)
    print(f"{args.mode} install test passed in {time.monotonic() - start:.0f} s")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
