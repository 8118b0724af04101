#!/usr/bin/env python3
"""Starves one thread of a process while its other threads run on.

    hold_thread.py TID SECONDS [--seed N]
    hold_thread.py TID SECONDS --until-released

For SECONDS, holds thread TID in slices of 5-40 ms with 1-5 ms of running
between (ptrace(2), as a debugger holds one thread; SIGSTOP would stop them
all), then lets it go. The campaign (campaign.py) holds walrelay's event
loop, its main thread (TID = its pid), so that librdkafka's threads or a
sink's connection thread act on what the loop handed them while the loop is
slow to hear of it: a loop descheduled on a starved machine.

With --until-released, holds it in one piece instead: prints "held" once the
thread is stopped, and lets it go when a line (or the end) comes on standard
input, or after SECONDS at the latest. The campaign holds two threads of one
walrelay this way, each with a holder of its own, to let them run in the
order it chooses.

A process of its own, not a thread of the campaign: the campaign is
walrelay's parent, and a parent that also traces sees the ptrace stops in
its own wait for the exit. If this process dies, the kernel lets the thread
go (a tracee is detached when its tracer exits).
"""
import argparse
import ctypes
import os
import random
import select
import signal
import sys
import time

PTRACE_CONT = 7
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_EVENT_STOP = 128
WALL = 0x40000000

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long


class Gone(Exception):
    """The thread exited (walrelay stopped or was killed meanwhile)."""


def ptrace(request, tid, data=0):
    if libc.ptrace(request, tid, None, ctypes.c_void_p(data)) != 0:
        err = ctypes.get_errno()
        if err == 3:  # ESRCH
            raise Gone()
        raise OSError(err, f"ptrace({request}, {tid}): {os.strerror(err)}")


class Held:
    def __init__(self, tid):
        self.tid = tid
        self.signal = 0  # one meant for the thread while it was held: passed on
        ptrace(PTRACE_SEIZE, tid)

    def stop(self):
        ptrace(PTRACE_INTERRUPT, self.tid)
        while True:
            try:
                _, status = os.waitpid(self.tid, WALL)
            except ChildProcessError:
                raise Gone()
            if not os.WIFSTOPPED(status):
                raise Gone()
            if status >> 16 == PTRACE_EVENT_STOP:
                return
            # A signal for the thread (a SIGTERM, say): kept, and the wait
            # goes on for the interrupt's stop.
            self.signal = os.WSTOPSIG(status)
            ptrace(PTRACE_CONT, self.tid, self.signal)
            self.signal = 0

    def go(self):
        ptrace(PTRACE_CONT, self.tid, self.signal)
        self.signal = 0

    def detach(self):
        ptrace(PTRACE_DETACH, self.tid, self.signal)


def exiting(tid):
    """Whether thread `tid` is gone or a zombie (its state in /proc: Z or X)."""
    try:
        with open(f"/proc/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def gone(tid, after=""):
    """Said, and exit 0: walrelay stopped or was killed meanwhile."""
    print(f"hold_thread: thread {tid} gone{after}", flush=True)
    return 0


def hold_until_released(held, seconds):
    try:
        held.stop()
        print("held", flush=True)
        ready, _, _ = select.select([sys.stdin], [], [], seconds)
        if ready:
            sys.stdin.readline()
        held.detach()
    except Gone:
        return gone(held.tid)
    print(f"hold_thread: thread {held.tid} held{'' if ready else f' for {seconds} s (never released)'}", flush=True)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tid", type=int)
    p.add_argument("seconds", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--until-released", action="store_true")
    a = p.parse_args()
    rng = random.Random(a.seed)
    slices = 0
    try:
        held = Held(a.tid)
    except PermissionError as e:
        if exiting(a.tid):  # (a thread on its way out refuses a tracer too)
            return gone(a.tid)
        # A machine that forbids ptrace (no CAP_SYS_PTRACE): said, not a failure.
        print(f"hold_thread: not permitted here ({e})", flush=True)
        return 3
    except Gone:
        return gone(a.tid)
    if a.until_released:
        return hold_until_released(held, a.seconds)
    try:
        end = time.monotonic() + a.seconds
        while time.monotonic() < end:
            held.stop()
            slices += 1
            time.sleep(rng.uniform(0.005, 0.040))
            held.go()
            time.sleep(rng.uniform(0.001, 0.005))
        held.stop()
        held.detach()
    except Gone:
        return gone(a.tid, f" after {slices} slices")
    print(f"hold_thread: thread {a.tid} held in {slices} slices over {a.seconds} s", flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the kernel lets the thread go
    sys.exit(main())
