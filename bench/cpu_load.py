#!/usr/bin/env python3
"""CPU time other processes took while a benchmark ran (Python side of bench/cpu_load.hpp).

others = busy time of every CPU (/proc/stat: user + nice + system + irq + softirq + steal)
         minus the benchmark's own CPU time, over the wall time, in cores.

As a module: Window() around a timed region of this process (its own time from
/proc/self/stat, every thread), .fields() gives the JSON members.

As a command, it wraps another one and adds the same members for the whole command (its
process tree, reaped children included, from wait4's rusage) to every JSON line it prints,
prefixed process_ so that a benchmark's own window figures stay as they are:
  cpu_load.py [--tag KEY=VALUE ...] -- COMMAND [ARGS...]   (tags are added to each line too)
  cpu_load.py --idle SECONDS        # others' load with nothing of ours running
"""

import argparse
import json
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def machine_busy():
    """(busy seconds, steal seconds) over every CPU since boot; (None, None) off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None, None
    if fields[0] != "cpu" or len(fields) < 9:
        return None, None
    # guest and guest_nice are already inside user and nice
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    return (user + nice + system + irq + softirq + steal) / TICK, steal / TICK


def self_cpu():
    """utime + stime of this process (every thread), seconds."""
    try:
        with open("/proc/self/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # rest[0] is field 3 (state); utime and stime are fields 14 and 15
    return (int(rest[11]) + int(rest[12])) / TICK


def load_fields(wall, busy, steal, own, prefix=""):
    if busy is None or own is None or wall <= 0:
        return {prefix + "window_s": round(wall, 3), prefix + "self_cores": -1,
                prefix + "others_cores": -1, prefix + "steal_cores": -1}
    return {
        prefix + "window_s": round(wall, 3),
        prefix + "self_cores": round(own / wall, 2),
        # both counters advance in whole ticks, so a quiet window can read a hair below zero
        prefix + "others_cores": round(max(busy - own, 0.0) / wall, 2),
        prefix + "steal_cores": round(steal / wall, 2),
    }


class Window:
    """Others' load over a timed region of this process: start() ... stop(); fields()."""

    def start(self):
        self.t0 = time.perf_counter()
        self.busy0, self.steal0 = machine_busy()
        self.self0 = self_cpu()

    def stop(self):
        self.t1 = time.perf_counter()
        self.busy1, self.steal1 = machine_busy()
        self.self1 = self_cpu()

    def fields(self):
        known = None not in (self.busy0, self.busy1, self.self0, self.self1)
        return load_fields(self.t1 - self.t0,
                           self.busy1 - self.busy0 if known else None,
                           self.steal1 - self.steal0 if known else None,
                           self.self1 - self.self0 if known else None)


def wrap(tags, command):
    busy0, steal0 = machine_busy()
    t0 = time.perf_counter()
    own0 = os.times()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.readlines()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    t1 = time.perf_counter()
    busy1, steal1 = machine_busy()
    own1 = os.times()
    # the command's tree (rusage of the reaped child and everything it reaped) and this wrapper
    own = usage.ru_utime + usage.ru_stime + (own1.user - own0.user) + (own1.system - own0.system)
    extra = load_fields(t1 - t0, None if busy0 is None else busy1 - busy0,
                        None if busy0 is None else steal1 - steal0, own, prefix="process_")
    extra = {**tags, **extra}
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("{"):
            try:
                row = json.loads(stripped)
            except ValueError:
                sys.stdout.write(line)
                continue
            print(json.dumps({**row, **extra}))
        else:
            sys.stdout.write(line)
    sys.stdout.flush()
    return proc.returncode


def idle(seconds):
    busy0, steal0 = machine_busy()
    t0 = time.perf_counter()
    own0 = os.times()
    time.sleep(seconds)
    busy1, steal1 = machine_busy()
    own1 = os.times()
    own = (own1.user - own0.user) + (own1.system - own0.system)
    row = {"bench": "idle", **load_fields(time.perf_counter() - t0, None if busy0 is None else busy1 - busy0,
                                          None if busy0 is None else steal1 - steal0, own)}
    print(json.dumps(row))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--idle", type=float, help="measure others' load over this many seconds and exit")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if args.idle is not None:
        return idle(args.idle)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command to run")
    tags = {}
    for t in args.tag:
        key, sep, value = t.partition("=")
        if not sep:
            ap.error(f"--tag {t}: expected KEY=VALUE")
        tags[key] = value
    return wrap(tags, command)


if __name__ == "__main__":
    sys.exit(main())
