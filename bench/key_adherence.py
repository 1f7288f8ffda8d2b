#!/usr/bin/env python3
"""Key adherence of generated chorales: music21's key analysis of each sample against the asked key.

Reads DIR/cfg<C>/<tonic>-<mode>/sample-*.mid (written by bench/key_adherence.sh through
examples/generate), runs music21's `score.analyze('key')` on each (the Krumhansl-Schmuckler-style
profile correlation that also labelled the training chorales, docs/chorales.md) and counts, per
guidance coefficient, how often the analysed key equals the asked one (tonic pitch class and mode;
chance 1/24), how often the tonic alone does (chance 1/12), the mode alone (chance 1/2), and the
asked key or its relative (same key signature; chance 1/12). Prints a Markdown table and writes
DIR/key_adherence.json with every sample's result.
  key_adherence.py DIR
Needs PyPI's music21 (bench/key_adherence.sh installs it into a venv under build/).
"""

import json
import pathlib
import sys

import music21

TONICS = ["C", "C#", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B"]


def pitch_class(name):
    return music21.pitch.Pitch(name.replace("b", "-") if len(name) > 1 else name).pitchClass


def relative(pc, mode):
    """The pitch class and mode of the relative key (same signature)."""
    return ((pc + 9) % 12, "minor") if mode == "major" else ((pc + 3) % 12, "major")


def analyse(path):
    try:
        score = music21.converter.parse(str(path))
        if not score.flatten().notes:
            return None
        k = score.analyze("key")
        return {"tonic": k.tonic.pitchClass, "name": k.tonic.name, "mode": k.mode,
                "correlation": round(k.correlationCoefficient, 3)}
    except Exception as exc:  # an unreadable or empty sample counts as a miss, with the reason
        return {"error": str(exc)}


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = pathlib.Path(sys.argv[1])
    results = []
    for cfg_dir in sorted(root.glob("cfg*")):
        coef = cfg_dir.name[3:]
        for key_dir in sorted(cfg_dir.iterdir()):
            if not key_dir.is_dir():
                continue
            tonic, mode = key_dir.name.rsplit("-", 1)
            pc = pitch_class(tonic)
            for mid in sorted(key_dir.glob("sample-*.mid")):
                a = analyse(mid)
                ok = a is not None and "error" not in a
                results.append({
                    "cfg": coef, "asked": f"{tonic} {mode}", "sample": mid.name, "analysed": a,
                    "key": ok and a["tonic"] == pc and a["mode"] == mode,
                    "tonic": ok and a["tonic"] == pc,
                    "mode": ok and a["mode"] == mode,
                    "key_or_relative": ok and ((a["tonic"], a["mode"]) in ((pc, mode), relative(pc, mode))),
                })
    if not results:
        print(f"key_adherence.py: no samples under {root}/cfg*/<key>-<mode>/")
        return 1
    (root / "key_adherence.json").write_text(json.dumps(results, indent=1))

    def rate(rows, field):
        return sum(r[field] for r in rows) / len(rows)

    print("| guidance | samples | key (tonic and mode) | tonic | mode | key or relative | unanalysable |")
    print("|---|---|---|---|---|---|---|")
    for coef in sorted({r["cfg"] for r in results}, key=float):
        rows = [r for r in results if r["cfg"] == coef]
        bad = sum(1 for r in rows if r["analysed"] is None or "error" in r["analysed"])
        print(f"| cfg {coef} | {len(rows)} | {rate(rows, 'key'):.0%} | {rate(rows, 'tonic'):.0%} |"
              f" {rate(rows, 'mode'):.0%} | {rate(rows, 'key_or_relative'):.0%} | {bad} |")
    print("| chance | | 4% (1/24) | 8% (1/12) | 50% | 8% (1/12) | |")
    print()
    print("Per asked key, samples whose analysed key matches (per guidance):")
    coefs = sorted({r["cfg"] for r in results}, key=float)
    print("| asked | " + " | ".join(f"cfg {c}" for c in coefs) + " |")
    print("|---|" + "---|" * len(coefs))
    for mode in ("major", "minor"):
        for tonic in TONICS:
            asked = f"{tonic} {mode}"
            cells = []
            for c in coefs:
                rows = [r for r in results if r["cfg"] == c and r["asked"] == asked]
                cells.append(f"{sum(r['key'] for r in rows)}/{len(rows)}" if rows else "-")
            if any(cell != "-" for cell in cells):
                print(f"| {asked} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
