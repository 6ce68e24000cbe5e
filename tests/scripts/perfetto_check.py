#!/usr/bin/env python3
"""perfetto_check.py TRACE.json [--expect-partition] [--expect-drops]: checks a simulator trace
against the Chrome trace-event format that Perfetto reads (spec/sim.md SIM-12).

Checks: the file is one JSON object with a traceEvents list; every event has
a known phase and the fields that phase needs, with the right types; times
are numbers that never go backwards within a thread; every async slice
("b") is ended once ("e", same cat/id/pid, not earlier) and no end comes
without its begin; every flow start ("s") has one end ("f") not earlier, on
another or the same process; every frame delivered or dropped was sent (a
send slice with its msg id, duplicates included); each host has process and
thread names; with --expect-partition, a partition instant exists; with
--expect-drops, a dropped-frame instant exists. Prints one line per check
group and exits 1 on the first failure.
"""
import json
import sys

PHASES = {"M", "b", "e", "X", "s", "f", "i", "C"}


def fail(msg):
    print(f"FAIL perfetto: {msg}")
    sys.exit(1)


def main():
    if len(sys.argv) < 2:
        print("usage: perfetto_check.py TRACE.json [--expect-partition] [--expect-drops]", file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1]) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"not readable JSON: {e}")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail("the top level is not an object with a traceEvents list")
    events = doc["traceEvents"]
    if not events:
        fail("no events")
    names, threads = set(), set()
    last_ts = {}
    open_slices, flows = {}, {}
    counts = {p: 0 for p in PHASES}
    partition = False
    sent, delivered, dropped = set(), [], []
    for n, e in enumerate(events):
        ph = e.get("ph")
        if ph not in PHASES:
            fail(f"event {n}: unknown phase {ph!r}")
        counts[ph] += 1
        for key in ("name", "pid", "tid"):
            if key not in e:
                fail(f"event {n} ({ph}): no {key}")
        if not isinstance(e["pid"], int) or not isinstance(e["tid"], int):
            fail(f"event {n}: pid and tid must be integers")
        if ph == "M":
            if e["name"] == "process_name":
                names.add(e["pid"])
            elif e["name"] == "thread_name":
                threads.add((e["pid"], e["tid"]))
            if not isinstance(e.get("args", {}).get("name"), str):
                fail(f"event {n}: metadata without args.name")
            continue
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or ts < 0:
            fail(f"event {n} ({ph}): ts {ts!r} is not a non-negative number")
        track = (e["pid"], e["tid"])
        if ts < last_ts.get(track, 0):
            fail(f"event {n}: time goes backwards on pid {track[0]} tid {track[1]}")
        last_ts[track] = ts
        if (e["pid"] not in names) or (track not in threads):
            fail(f"event {n}: pid {e['pid']} tid {e['tid']} has no name")
        if ph in ("b", "e"):
            key = (e.get("cat"), e.get("id"), e["pid"])
            if key[0] is None or key[1] is None:
                fail(f"event {n}: async event without cat or id")
            if ph == "b":
                if key in open_slices:
                    fail(f"event {n}: async slice {key} begun twice")
                open_slices[key] = (ts, e["name"])
            else:
                if key not in open_slices:
                    fail(f"event {n}: async slice {key} ends without a begin")
                began, name = open_slices.pop(key)
                if ts < began or name != e["name"]:
                    fail(f"event {n}: async slice {key} ends before it began or renamed")
        elif ph == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                fail(f"event {n}: complete event without a duration")
            if e.get("cat") == "net":
                msg = e.get("args", {}).get("msg")
                if not isinstance(msg, int):
                    fail(f"event {n}: a frame slice without its msg id")
                if e["name"].startswith("send"):
                    if msg in sent:
                        fail(f"event {n}: frame {msg} sent twice")
                    sent.add(msg)
                else:
                    delivered.append((n, msg))
        elif ph in ("s", "f"):
            fid = e.get("id")
            if fid is None:
                fail(f"event {n}: flow without id")
            if ph == "s":
                if fid in flows:
                    fail(f"event {n}: flow {fid} started twice")
                flows[fid] = ts
            else:
                if fid not in flows:
                    fail(f"event {n}: flow {fid} ends without a start")
                if ts < flows.pop(fid) or e.get("bp") != "e":
                    fail(f"event {n}: flow {fid} ends before it starts, or not bound to its slice")
        elif ph == "i":
            if e.get("s") not in ("g", "p", "t"):
                fail(f"event {n}: instant without a scope")
            partition = partition or e["name"].startswith("partition")
            if e.get("cat") == "net":
                dropped.append((n, e.get("args", {}).get("msg")))
        elif ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args or \
               not all(isinstance(v, (int, float)) for v in args.values()):
                fail(f"event {n}: counter without numeric args")
    for what, seen in (("delivered", delivered), ("dropped", dropped)):
        for n, msg in seen:
            if msg not in sent:
                fail(f"event {n}: frame {msg} {what} but never sent")
    if open_slices:
        fail(f"{len(open_slices)} call slice(s) never ended, e.g. {next(iter(open_slices))}")
    if counts["b"] == 0 or counts["s"] == 0 or counts["C"] == 0:
        fail("no calls, no message flows or no counters in the trace")
    if "--expect-partition" in sys.argv and not partition:
        fail("no partition instant, though the run had a partition")
    if "--expect-drops" in sys.argv and not dropped:
        fail("no dropped-frame instant, though the run lost frames")
    print(f"PASS perfetto: {len(events)} events ({counts['b']} calls, {counts['s']} frames sent, "
          f"{counts['f']} delivered, {len(dropped)} dropped, {counts['i']} instants, {counts['C']} counter "
          f"samples) on {len(names)} hosts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
