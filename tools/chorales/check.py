#!/usr/bin/env python3
"""Sanity check of the converted Bach chorales, and their unigram baseline.

Usage:
    python3 tools/chorales/check.py [DIR]        (default build/chorales-npy)

Reads DIR/metadata.jsonl and the .npy files it names (written by convert.py) and checks:
every file is int16 [4, T]; tokens lie in the 51-token vocabulary (so below the card 64);
a hold never starts a stream or follows a rest; the metadata has the fields and condition
attributes the packing tool needs; identical arrays share a split group; the voices are in
SATB order (soprano above alto above tenor above bass in nearly all frames where both
sound, and in mean pitch).  Prints per-voice statistics and the unigram baseline: the
cross-entropy in nats/token of predicting each stream with its own unigram frequencies
over all chorales.  Needs only numpy.  Exits 1 on a failed check.
"""

import collections
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

REST, HOLD, PITCH_BASE, LOWEST = 0, 1, 2, 36
VOCAB, CARD = 51, 64
VOICES = ("soprano", "alto", "tenor", "bass")
# Fraction of co-sounding frames in which the upper voice must be at or above the lower.
MIN_ORDERED = 0.95


def unigram_baseline(arrays):
    """Per-stream cross-entropy (nats/token) of each stream's own unigram distribution."""
    counts = np.zeros((4, CARD), dtype=np.int64)
    for a in arrays:
        for k in range(4):
            counts[k] += np.bincount(a[k].astype(np.int64), minlength=CARD)[:CARD]
    result = []
    for k in range(4):
        p = counts[k][counts[k] > 0] / counts[k].sum()
        result.append(float(-(p * np.log(p)).sum()))
    return result


def print_unigram_baseline(arrays):
    ce = unigram_baseline(arrays)
    print("unigram baseline (nats/token, each stream predicted by its own unigram "
          "frequencies over all chorales):")
    for voice, value in zip(VOICES, ce):
        print(f"  {voice:8s} {value:.4f}  (ppl {math.exp(value):.2f})")
    mean = sum(ce) / len(ce)
    print(f"  mean     {mean:.4f}  (ppl {math.exp(mean):.2f}; uniform over the card: "
          f"{math.log(CARD):.4f})")
    return ce


def sounding_pitch(row):
    """Pitch sounding in each frame (onsets carried through holds), -1 when resting."""
    pitch = np.where(row >= PITCH_BASE, row.astype(np.int64) - PITCH_BASE + LOWEST, -1)
    for t in range(1, len(row)):
        if row[t] == HOLD:
            pitch[t] = pitch[t - 1]
    return pitch


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0] if argv else "build/chorales-npy")
    failures = []

    def fail(message):
        failures.append(message)
        if len(failures) <= 20:
            print("FAIL:", message)

    lines = (folder / "metadata.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    arrays = []
    digests = {}
    files = set()
    ordered = np.zeros(3, dtype=np.int64)
    both = np.zeros(3, dtype=np.int64)
    pitch_sum = np.zeros(4)
    pitch_n = np.zeros(4)
    token_counts = collections.Counter()
    for rec in records:
        for field in ("file", "id", "caption", "attributes", "group"):
            if not rec.get(field):
                fail(f"{rec.get('file')}: metadata field {field!r} missing or empty")
        attrs = rec.get("attributes", {})
        for field in ("key", "mode", "time_signature", "bwv"):
            if not isinstance(attrs.get(field), str) or not attrs.get(field):
                fail(f"{rec.get('file')}: attribute {field!r} missing")
        if attrs.get("mode") not in ("major", "minor"):
            fail(f"{rec['file']}: mode {attrs.get('mode')!r}")
        if rec["file"] in files:
            fail(f"{rec['file']}: listed twice")
        files.add(rec["file"])

        a = np.load(folder / rec["file"])
        if a.dtype != np.int16 or a.ndim != 2 or a.shape[0] != 4 or a.shape[1] == 0:
            fail(f"{rec['file']}: dtype {a.dtype} shape {a.shape}")
            continue
        arrays.append(a)
        if a.min() < 0 or a.max() >= VOCAB:
            fail(f"{rec['file']}: token outside 0..{VOCAB - 1}: {a.min()}..{a.max()}")
        for k in range(4):
            row = a[k]
            if row[0] == HOLD:
                fail(f"{rec['file']}: {VOICES[k]} starts with a hold")
            bad = np.nonzero((row[1:] == HOLD) & (row[:-1] == REST))[0]
            if len(bad):
                fail(f"{rec['file']}: {VOICES[k]} hold after rest at frame {bad[0] + 1}")
        token_counts.update(a.ravel().tolist())
        pitches = np.stack([sounding_pitch(a[k]) for k in range(4)])
        for k in range(4):
            sounding = pitches[k] >= 0
            pitch_sum[k] += pitches[k][sounding].sum()
            pitch_n[k] += sounding.sum()
        for k in range(3):
            mask = (pitches[k] >= 0) & (pitches[k + 1] >= 0)
            both[k] += mask.sum()
            ordered[k] += (pitches[k][mask] >= pitches[k + 1][mask]).sum()
        digest = hashlib.sha256(a.tobytes() + bytes(str(a.shape), "ascii")).hexdigest()
        if digest in digests and digests[digest]["group"] != rec["group"]:
            fail(f"{rec['file']}: same tokens as {digests[digest]['file']} but another group")
        digests.setdefault(digest, rec)

    if not arrays:
        fail("no chorales")
    else:
        frames = sum(a.shape[1] for a in arrays)
        total = sum(token_counts.values())
        print(f"{len(arrays)} chorales, {frames} frames, {total} tokens, "
              f"{len({r['group'] for r in records})} groups, "
              f"{len(arrays) - len(digests)} exact duplicates")
        print(f"token shares: rest {token_counts[REST] / total:.3f}, hold "
              f"{token_counts[HOLD] / total:.3f}, onsets "
              f"{1 - (token_counts[REST] + token_counts[HOLD]) / total:.3f}; "
              f"ids used {min(token_counts)}..{max(token_counts)} of card {CARD}")
        means = pitch_sum / np.maximum(pitch_n, 1)
        print("mean sounding pitch: " + ", ".join(f"{v} {m:.1f}" for v, m in zip(VOICES, means)))
        if not all(means[k] > means[k + 1] for k in range(3)):
            fail(f"mean pitches not in SATB order: {means}")
        for k in range(3):
            share = ordered[k] / max(both[k], 1)
            print(f"{VOICES[k]} at or above {VOICES[k + 1]}: {share:.4f} of {both[k]} frames")
            if share < MIN_ORDERED:
                fail(f"{VOICES[k]} above {VOICES[k + 1]} in only {share:.4f} of frames")
        modes = collections.Counter(r["attributes"]["mode"] for r in records)
        meters = collections.Counter(r["attributes"]["time_signature"] for r in records)
        print(f"modes {dict(sorted(modes.items()))}, time signatures {dict(meters.most_common())}")
        print_unigram_baseline(arrays)

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
