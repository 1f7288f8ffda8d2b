#!/usr/bin/env python3
"""Summary of one bench/run.sh: ceilings, each contender as a fraction of them, ratios.

Reads the JSON lines run.sh collected (step_bench's and torch_step.py's, each tagged by
bench/cpu_load.py with "who", "config" and "round"). A figure whose timed window saw other
processes use more than --max-others cores (or whose load could not be read) is marked
CONTENDED with the load; --strict refuses to print figures at all when any is contended.
--record FILE appends the same summary to FILE (docs/benchmarks.md) as one dated Markdown section
naming the CPU, its flags that matter and the commit, so no figure needs a hand edit.
  step_report.py LINES.jsonl [--max-others 0.1] [--strict] [--skipped "WHO: why" ...] [--failed "..." ...]
                 [--record FILE [--commit C] [--setting "what" ...] [--cpuinfo /proc/cpuinfo]]
"""

import argparse
import datetime
import json
import os
import statistics
import sys

CONFIGS = {
    "tiny": "K4 C2048 d256 L4 H4, B8 T256",
    "tiny_long": "K4 C2048 d256 L4 H4, B1 T2048",
    "small": "K4 C2048 d512 L8 H8, B4 T512",
}
# (who, precision of the ceilings it is measured against)
CONTENDERS = [
    ("etude fp32", "fp32"),
    ("etude bf16", "bf16"),
    ("torch 1.13 fp32", "fp32"),
    ("torch 2 compiled fp32", "fp32"),
    ("torch 2 compiled bf16", "bf16"),
]
CEILINGS = [
    ("fma_peak", "fp32 FMA peak"),
    ("fp32_gemm", "fp32 gemm in use"),
    ("bf16_dot_peak", "bf16 dot-product peak"),
    ("amx_bf16_peak", "AMX bf16 tile peak"),
    ("bf16_gemm", "bf16 gemm in use"),
]
# the ceilings each precision's results are a fraction of; "bf16_peak" is the peak of the bf16
# instructions the row's products ran on (relevant_ceilings, which also drops the FMA peak on AMX)
RELEVANT = {"fp32": ["fma_peak", "fp32_gemm"], "bf16": ["bf16_peak", "bf16_gemm", "fma_peak"]}
SHORT = {"fma_peak": "FMA peak", "fp32_gemm": "fp32 gemm", "bf16_dot_peak": "bf16 dot peak",
         "amx_bf16_peak": "AMX tile peak", "bf16_gemm": "bf16 gemm"}


def relevant_ceilings(precision, rows, ceiling):
    """The ceilings a contender's rows are a fraction of. For bf16 on a CPU with AMX (its tile peak
    measured) the tile peak and the bf16 gemm, where the row's products (bf16_products and
    attention_products in etude's rows) say they ran on AMX or name no path (PyTorch, whose
    autocast multiplies on oneDNN's AMX kernels there); otherwise the dot-product peak, the bf16
    gemm and the FMA peak (bf16 work the dot products do not take runs on FMA)."""
    if precision != "bf16":
        return RELEVANT[precision]
    paths = " ".join(str(r.get("bf16_products", "")) + " " + str(r.get("attention_products", "")) for r in rows)
    named = any(r.get("bf16_products") or r.get("attention_products") for r in rows)
    if "amx_bf16_peak" in ceiling and ("amx" in paths.lower() or not named):
        return ["amx_bf16_peak", "bf16_gemm"]
    return ["bf16_dot_peak" if c == "bf16_peak" else c for c in RELEVANT[precision]]
RATIOS = [
    ("etude fp32", "torch 1.13 fp32"),
    ("etude fp32", "torch 2 compiled fp32"),
    ("etude bf16", "torch 2 compiled bf16"),
    ("etude fp32", "strongest peer"),
    ("etude bf16", "strongest peer"),
]


def others(row):
    """Cores other processes used during the row's timed window (its own, else the whole command's)."""
    v = row.get("others_cores", row.get("process_others_cores", -1))
    return -1.0 if v is None else float(v)


def contended(row, limit):
    o = others(row)
    return o < 0 or o > limit


def mark(rows, limit):
    bad = [r for r in rows if contended(r, limit)]
    if not bad:
        return f"quiet (others ≤ {max(others(r) for r in rows):.2f} cores)"
    worst = max(others(r) for r in bad)
    if worst < 0:
        return "CONTENDED: others' load unknown"
    return f"CONTENDED: others used {worst:.2f} cores ({len(bad)} of {len(rows)} rounds)"


# The CPU flags that decide which kernels and ceilings a run has (named in every recorded table).
FLAGS = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"]


def cpu_description(cpuinfo):
    """'MODEL NAME; N online; flags: avx2 fma ..., no amx_bf16' from a /proc/cpuinfo text."""
    model, flags = "unknown CPU", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    try:
        online = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        online = os.cpu_count() or 0
    have = [f for f in FLAGS if f in flags]
    lack = [f"no {f}" for f in FLAGS if f not in flags]
    return f"{model}; {online} online; flags: {', '.join(have + lack)}"


def row(*cells):
    """One Markdown table row; a '|' inside a cell is escaped."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def record(path, args, rec):
    """Appends one dated Markdown section with this run's ceilings, figures and ratios to path."""
    try:
        cpuinfo = open(args.cpuinfo).read()
    except OSError:
        cpuinfo = ""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = cpu_description(cpuinfo)
    out = [f"### {now}: {cpu.split(';')[0]}, code {args.commit}", ""]
    out.append(f"Written by `bench/run.sh`. CPU: {cpu}.")
    if args.setting:
        out.append("Settings: " + "; ".join(args.setting) + ".")
    out += [f"Before the run: {line}" for line in rec["idle"]]
    out += ["", rec["verdict"]]
    out += ["", row("ceiling", "GFLOP/s", "path", "load"), "|---|---|---|---|"]
    out += [row(*c) for c in rec["ceilings"]]
    if rec["rows"]:
        out += ["", row("config", "side", "ms/step", "tokens/s", "GFLOP/s", "share of its ceilings", "load"),
                "|---|---|---|---|---|---|---|"]
        last = None
        for config, *rest in rec["rows"]:
            out.append(row(config if config != last else "", *rest))
            last = config
    if rec["ratios"]:
        out += ["", row("config", "ratio of tokens/s, round by round", "median [min–max]"), "|---|---|---|"]
        last = None
        for config, *rest in rec["ratios"]:
            out.append(row(config if config != last else "", *rest))
            last = config
    if rec["notes"]:
        out += [""] + [f"- {line}" for line in rec["notes"]]
    text = "\n".join(out) + "\n"
    exists = os.path.exists(path)
    old = open(path).read() if exists else ""
    with open(path, "a") as f:
        if not exists:
            f.write("# Benchmarks\n")
        elif old and not old.endswith("\n"):
            f.write("\n")
        f.write("\n" + text)
    print(f"Recorded in {path}.")


def spread(values, fmt):
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lines")
    ap.add_argument("--max-others", type=float, default=0.1)
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--skipped", action="append", default=[], help="a contender not run, and why")
    ap.add_argument("--failed", action="append", default=[], help="a peer's run that failed")
    ap.add_argument("--record", help="append a dated Markdown table of this run to this file")
    ap.add_argument("--commit", default="unknown", help="the code's commit, for --record")
    ap.add_argument("--setting", action="append", default=[], help="a setting of the run, for --record")
    ap.add_argument("--cpuinfo", default="/proc/cpuinfo", help="where --record reads the CPU's name and flags")
    args = ap.parse_args()
    limit = args.max_others

    rows = []
    for line in open(args.lines):
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    ceiling_rows = {name: [r for r in rows if r.get("bench") == name] for name, _ in CEILINGS}
    step_rows = [r for r in rows if r.get("who") and r.get("config")]
    n_bad = sum(contended(r, limit) for r in rows if r.get("bench") != "idle" and r.get("gflops", 0) is not None)
    n_all = sum(1 for r in rows if r.get("bench") != "idle" and r.get("gflops", 0) is not None)

    if args.strict and n_bad:
        print(f"REFUSED: {n_bad} of {n_all} figures were taken while other processes used more than {limit} "
              f"cores (or their load could not be read); nothing reported. Rerun on a quiet machine, or without "
              f"ETUDE_BENCH_STRICT to see them marked.")
        return 3

    rec = {"ceilings": [], "rows": [], "ratios": [], "notes": [], "verdict": "", "idle": []}  # for --record
    for r in rows:
        if r.get("bench") == "idle":
            print(f"Before the run, with nothing of ours running: others used {others(r):.2f} cores "
                  f"over {r['window_s']:.1f} s.")
            rec["idle"].append(f"others used {others(r):.2f} cores over {r['window_s']:.1f} s with nothing of ours running.")
    # A ceiling is the best quiet measurement; if every one was contended, the best contended one, marked.
    ceiling = {}
    print("Ceilings, measured in this run (best quiet measurement over the rounds):")
    for name, title in CEILINGS:
        rs = ceiling_rows[name]
        if not rs:
            print(f"  {title:24s} not measured")
            rec["ceilings"].append((title, "not measured", "", ""))
            continue
        measured = [r for r in rs if r.get("gflops") is not None]
        if not measured:
            print(f"  {title:24s} n/a ({rs[0].get('isa', 'unavailable')})")
            rec["ceilings"].append((title, "n/a", rs[0].get("isa", "unavailable"), ""))
            continue
        quiet = [r for r in measured if not contended(r, limit)]
        best = max(quiet or measured, key=lambda r: r["gflops"])
        ceiling[name] = best["gflops"]
        what = best.get("isa") or best.get("op", "")
        for path in ("float_products", "bf16_products"):
            if best.get(path):
                what += f" [{best[path]}]"
        print(f"  {title:24s} {best['gflops']:7.1f} GFLOP/s  {what}  "
              f"{'quiet' if quiet else mark(measured, limit)}")
        rec["ceilings"].append((title, f"{best['gflops']:.1f}", what, "quiet" if quiet else mark(measured, limit)))

    for config, desc in CONFIGS.items():
        mine = [r for r in step_rows if r["config"] == config]
        if not mine:
            continue
        rounds = sorted({int(r["round"]) for r in mine})
        print(f"\n{config} ({desc}), {len(rounds)} interleaved round(s): median [min–max]")
        by_who = {}
        for who, precision in CONTENDERS:
            rs = [r for r in mine if r["who"] == who]
            if not rs:
                continue
            by_who[who] = rs
            tok = [r["tokens_per_s"] for r in rs]
            ms = [r["ms_per_step"] for r in rs]
            gf = [r["gflops"] for r in rs]
            fractions = []
            for c in relevant_ceilings(precision, rs, ceiling):
                if c in ceiling:
                    fractions.append(f"{statistics.median(gf) / ceiling[c]:.0%} of {SHORT[c]}")
                elif ceiling_rows.get(c) and all(r.get("gflops") is None for r in ceiling_rows[c]):
                    fractions.append(f"{SHORT[c]} n/a")
            print(f"  {who:22s} {spread(ms, '{:.0f}')} ms/step  {spread(tok, '{:.0f}')} tok/s  "
                  f"{statistics.median(gf):.1f} GFLOP/s = {', '.join(fractions)}  | {mark(rs, limit)}")
            rec["rows"].append((f"{config} ({desc}), {len(rounds)} round(s)", who, spread(ms, "{:.0f}"),
                                spread(tok, "{:.0f}"), f"{statistics.median(gf):.1f}", ", ".join(fractions),
                                mark(rs, limit)))
            moved = [r for r in rs if isinstance(r.get("mb_per_step"), dict)]
            if moved:
                # step_bench's count: the tensors the model's ops wrote (observed) and the parameter
                # passes (gradients cleared and normed, the optimiser's reads and writes)
                ops = statistics.median(r["mb_per_step"]["written_by_ops"] for r in moved)
                passes = statistics.median(r["mb_per_step"]["parameter_passes"] for r in moved)
                rate = statistics.median(r["gb_per_s"] for r in moved)
                line = (f"{config}, {who}: {ops + passes:.0f} MB a step ({ops:.0f} written by the model's ops, "
                        f"{passes:.0f} in the passes over the parameters), {rate:.1f} GB/s over the step")
                print(f"  {line}")
                rec["notes"].append(line)
        for line in args.skipped:
            print(f"  {line}")

        # Ratios of tokens/s within each round (the runs are interleaved, so a round's load falls on both).
        peers = [w for w, _ in CONTENDERS if not w.startswith("etude") and w in by_who]
        printed = False
        for mine_who, peer in RATIOS:
            if mine_who not in by_who:
                continue
            ratios, bad = [], False
            for rnd in rounds:
                a = [r for r in by_who[mine_who] if int(r["round"]) == rnd]
                if peer == "strongest peer":
                    cands = [r for p in peers for r in by_who[p] if int(r["round"]) == rnd]
                    b = [max(cands, key=lambda r: r["tokens_per_s"])] if cands else []
                else:
                    b = [r for r in by_who.get(peer, []) if int(r["round"]) == rnd]
                if a and b:
                    ratios.append(a[0]["tokens_per_s"] / b[0]["tokens_per_s"])
                    bad = bad or contended(a[0], limit) or contended(b[0], limit)
            if not ratios:
                continue
            if not printed:
                print("  ratios of tokens/s, round by round:")
                printed = True
            label = peer
            if peer == "strongest peer":
                best = max(peers, key=lambda p: statistics.median(r["tokens_per_s"] for r in by_who[p]))
                label = f"strongest peer ({best})"
            print(f"    {mine_who} / {label}: {spread(ratios, '{:.2f}x')}"
                  f"{'  CONTENDED' if bad else ''}")
            rec["ratios"].append((config, f"{mine_who} / {label}", spread(ratios, "{:.2f}x") + (" CONTENDED" if bad else "")))

    print()
    for line in args.failed:
        print(f"FAILED: {line}")
    if not n_all:
        verdict = "VERDICT: no figures were taken."
    elif n_bad:
        verdict = (f"VERDICT: {n_bad} of {n_all} figures were taken while other processes used more than {limit} cores "
                   f"(or their load could not be read): CONTENDED, not fit to quote. Rerun on a quiet machine "
                   f"(ETUDE_BENCH_MAX_OTHERS sets the limit; ETUDE_BENCH_STRICT=1 refuses instead of marking).")
    else:
        verdict = f"VERDICT: quiet: every figure's timed window saw other processes use at most {limit} cores."
    print(verdict)
    if args.record:
        rec["verdict"] = verdict
        rec["notes"] = rec["notes"] + args.skipped + [f"FAILED: {line}" for line in args.failed]
        record(args.record, args, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
