"""What a results file records about where and with what it ran: the machine
(host name, uname, cores, CPU model, memory) and each walrelay binary's build
(its version, the commit of its source tree, CMAKE_BUILD_TYPE, when it was
built). bench/bench.py and bench/idle_threads.py write these into every
results file; bench/report.py prints them beside each table."""
import os
import platform
import subprocess
import time


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def machine():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {"hostname": platform.node(), "uname": " ".join(os.uname()), "nproc": os.cpu_count(), "cpu_model": cpu,
            "mem_gib": round(mem_kb / 1048576, 1), "kernel": platform.release(), "loadavg_at_start": os.getloadavg()}


def git_commit(directory):
    """`git describe --always --dirty` of the tree at directory, or None outside one."""
    try:
        out = subprocess.run(["git", "-C", directory, "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except OSError:
        return None


def build_info(binary):
    """A walrelay binary's build: `--version`, and from the CMakeCache.txt of the
    build directory it sits in, CMAKE_BUILD_TYPE and the source tree's commit.
    A binary outside a build directory (a copy) records that it is one."""
    path = os.path.realpath(binary)
    info = {"path": path}
    try:
        info["version"] = subprocess.run([path, "--version"], capture_output=True, text=True,
                                         timeout=10).stdout.strip()
        info["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(os.path.getmtime(path)))
    except OSError as e:
        info["version"] = f"? ({e})"
    cache = {}
    try:
        with open(os.path.join(os.path.dirname(path), "CMakeCache.txt")) as f:
            for line in f:
                if "=" in line and ":" in line.split("=", 1)[0]:
                    key, value = line.rstrip("\n").split("=", 1)
                    cache[key.split(":", 1)[0]] = value
    except OSError:
        info["build_type"] = None
        info["note"] = "no CMakeCache.txt beside the binary: build type and commit unknown"
        return info
    info["build_type"] = cache.get("CMAKE_BUILD_TYPE") or None
    source = cache.get("CMAKE_HOME_DIRECTORY")
    info["source"] = source
    info["commit"] = git_commit(source) if source else None
    return info
