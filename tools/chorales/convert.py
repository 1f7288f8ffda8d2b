#!/usr/bin/env python3
"""Convert the Bach chorales of music21's corpus into four token streams.

Every four-part (soprano, alto, tenor, bass) chorale in music21's bundled corpus becomes
one `.npy` array of shape [4, T] (int16): one row per voice, one column per sixteenth
note ("frame").  Each entry is one token of a fixed 51-entry vocabulary, the same
for all four voices:

    0                      rest        (the voice is silent in this frame)
    1                      hold        (the note sounding in the previous frame continues)
    2 + (midi - LOWEST)    onset       (a note of that MIDI pitch starts in this frame)

with LOWEST = 36 (C2) and HIGHEST = 84 (C6), so ids 0..50; the codebook card is 64
(the smallest power of two above 50), and ids 51..63 never occur.  The model uses
id 64 (= card) as its own special token.

Next to the arrays, `metadata.jsonl` holds one JSON line per chorale (file, corpus id,
title, caption (tools/chorales/caption.py), condition attributes, split group).  See
docs/chorales.md for the full description of the grid, voice selection, what is
dropped, and the regenerate commands.

Usage:
    python3 tools/chorales/convert.py --output build/chorales-npy [--limit N]

Needs numpy and music21 (`python3 -m pip install music21`); no network: the corpus
ships inside the music21 package.  Output is deterministic (sorted input order, no
randomness).
"""

import argparse
import collections
import copy
import hashlib
import json
import math
import re
import sys
import unicodedata
from fractions import Fraction
from pathlib import Path

import numpy as np

from caption import bars, chorale_caption   # tools/chorales/caption.py: the caption rule

# ---------------------------------------------------------------- vocabulary

REST = 0
HOLD = 1
PITCH_BASE = 2
LOWEST = 36    # C2, below the lowest bass note of the corpus
HIGHEST = 84   # C6, above the highest soprano note of the corpus
VOCAB = PITCH_BASE + (HIGHEST - LOWEST + 1)   # 51 ids in use: 0..50
CARD = 1 << (VOCAB - 1).bit_length()            # 64: the codebook size C

FRAMES_PER_QUARTER = 4        # sixteenth-note grid
NOMINAL_QUARTER_BPM = 120.0   # nominal tempo for the packed frame rate
FRAME_RATE = NOMINAL_QUARTER_BPM / 60.0 * FRAMES_PER_QUARTER   # 8.0 frames per second

VOICES = ("soprano", "alto", "tenor", "bass")
# Chords inside one voice keep one pitch: the outer one on the side the voice faces.
CHORD_PICK = {"soprano": "top", "alto": "top", "tenor": "bottom", "bass": "bottom"}

# Score formats read, by preference when one corpus entry exists in several formats.
FORMAT_PREFERENCE = (".mxl", ".musicxml", ".xml", ".krn")

assert VOCAB <= CARD and CARD == 64


def pitch_token(midi):
    return PITCH_BASE + (midi - LOWEST)


def token_pitch(token):
    return token - PITCH_BASE + LOWEST


# ---------------------------------------------------------------- corpus listing

def natural_key(text):
    """Sort 'bwv9.7' before 'bwv10.7' and 'bwv248.9' before 'bwv248.12'."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def list_sources(corpus_root, paths):
    """Returns ([(corpus id, path)], [(corpus id, reason)]) in natural sorted order.

    One file per corpus entry: when an entry exists in several score formats
    (bwv277.mxl and bwv277.krn), the preferred format is kept and the others are
    skipped as duplicates.  Non-score files (Roman-numeral analyses) are skipped.
    """
    by_stem = collections.defaultdict(list)
    skipped = []
    for path in paths:
        cid = path.relative_to(corpus_root).as_posix()
        if path.suffix.lower() not in FORMAT_PREFERENCE:
            skipped.append((cid, f"not a score ({path.suffix} file)"))
            continue
        by_stem[path.with_suffix("").relative_to(corpus_root).as_posix()].append(path)
    chosen = []
    for stem, files in by_stem.items():
        files.sort(key=lambda p: FORMAT_PREFERENCE.index(p.suffix.lower()))
        keep = files[0]
        chosen.append((keep.relative_to(corpus_root).as_posix(), keep))
        for other in files[1:]:
            skipped.append((other.relative_to(corpus_root).as_posix(),
                            f"duplicate encoding of {keep.relative_to(corpus_root).as_posix()}"))
    chosen.sort(key=lambda item: natural_key(item[0]))
    skipped.sort(key=lambda item: natural_key(item[0]))
    return chosen, skipped


# ---------------------------------------------------------------- voices

_VOICE_PATTERNS = (
    ("soprano", re.compile(r"^(soprano|sopran|s\.?|cantus|canto|discant(us)?)$")),
    ("alto", re.compile(r"^(alto|alt|altus|contralto|a\.?)$")),
    ("tenor", re.compile(r"^(tenor|tenore|t\.?)$")),
    ("bass", re.compile(r"^(bass|basso|bassus|b\.?)$")),
)


def voice_of_name(name):
    if not name:
        return None
    key = " ".join(str(name).lower().split())
    for voice, pattern in _VOICE_PATTERNS:
        if pattern.match(key):
            return voice
    return None


def identify_voices(score):
    """Returns ([part for soprano, alto, tenor, bass], how) or (None, reason)."""
    parts = list(score.parts)
    if len(parts) != 4:
        names = ", ".join(" ".join(str(p.partName or p.id).split()) for p in parts)
        return None, f"{len(parts)} parts, not 4 ({names})"
    named = [voice_of_name(p.partName) for p in parts]
    if all(v is not None for v in named):
        if sorted(named) != sorted(VOICES):
            return None, "part names are not one each of soprano/alto/tenor/bass: " + \
                ", ".join(str(p.partName) for p in parts)
        order = [parts[named.index(v)] for v in VOICES]
        return order, "names"
    if any(v is not None for v in named):
        return None, "only some parts are named as SATB voices: " + \
            ", ".join(str(p.partName) for p in parts)
    # Unnamed parts: score order (top staff first) if it is plausible by mean pitch.
    means = []
    for p in parts:
        pitches = [n.pitches[0].midi for n in p.recurse().notes if not n.duration.isGrace]
        if not pitches:
            return None, "an unnamed part has no notes"
        means.append(sum(pitches) / len(pitches))
    if not all(a > b for a, b in zip(means, means[1:])):
        return None, "unnamed parts whose score order is not high-to-low in mean pitch"
    return parts, "order"


# ---------------------------------------------------------------- grid

def to_frame(quarters):
    """Offset in quarter notes -> nearest sixteenth frame (halves round up)."""
    return math.floor(Fraction(quarters) * FRAMES_PER_QUARTER + Fraction(1, 2))


def on_grid(quarters):
    return (Fraction(quarters) * FRAMES_PER_QUARTER).denominator == 1


def pickup_quarters(part):
    """Length of the silence before a pickup (anacrusis) to fill a whole first bar."""
    measures = list(part.getElementsByClass("Measure"))
    if not measures:
        return Fraction(0)
    first = measures[0]
    pad = Fraction(first.paddingLeft or 0)
    if pad == 0:
        try:
            bar_length = Fraction(first.barDuration.quarterLength)
        except Exception:
            return Fraction(0)
        length = Fraction(first.duration.quarterLength)
        if 0 < length < bar_length and len(measures) > 1:
            pad = bar_length - length
    return pad


def first_voice_only(part, stats):
    """Keeps the first notated voice of measures split into several voices."""
    if not any(len(m.voices) > 1 for m in part.getElementsByClass("Measure")):
        return part
    part = copy.deepcopy(part)
    for measure in part.getElementsByClass("Measure"):
        voices = list(measure.voices)
        if len(voices) > 1:
            stats["measures with several voices in one part (first kept)"] += 1
            for extra in voices[1:]:
                measure.remove(extra)
    return part


def voice_tokens(part, voice, pad, length, stats):
    """Tokens [length] of one voice; frames start `pad` frames into the array."""
    tokens = np.full(length, REST, dtype=np.int16)
    written_end = 0          # frame after the last written note
    last_pitch = None        # pitch of the last written note
    pick = CHORD_PICK[voice]
    part = first_voice_only(part, stats)
    for element in part.flatten().notes:
        if element.duration.isGrace or element.duration.quarterLength == 0:
            stats["grace notes dropped"] += 1
            continue
        if element.isChord:
            stats[f"chords in one voice ({pick} note kept)"] += 1
            members = sorted(element.notes, key=lambda n: n.pitch.ps)
            chosen = members[-1] if pick == "top" else members[0]
            tie = chosen.tie or element.tie
        else:
            chosen = element
            tie = element.tie
        midi = int(round(chosen.pitch.ps))
        offset = Fraction(element.offset)
        end_q = offset + Fraction(element.duration.quarterLength)
        if not (on_grid(offset) and on_grid(end_q)):
            stats["notes off the sixteenth grid (rounded)"] += 1
        start = pad + to_frame(offset)
        end = pad + to_frame(end_q)
        if end <= start:
            stats["notes shorter than a frame after rounding (dropped)"] += 1
            continue
        if not LOWEST <= midi <= HIGHEST:
            raise ValueError(f"{voice} pitch {midi} outside {LOWEST}..{HIGHEST}")
        continues = (tie is not None and tie.type in ("stop", "continue")
                     and last_pitch == midi and written_end == start)
        if start < written_end:
            stats["overlapping notes in one voice (later wins)"] += 1
        tokens[start] = HOLD if continues else pitch_token(midi)
        tokens[start + 1:end] = HOLD
        written_end = end
        last_pitch = midi
    return tokens


# ---------------------------------------------------------------- metadata

def catalog_titles():
    """BWV id -> title, from music21's own chorale catalogue (no network)."""
    from music21.corpus import chorales
    titles = {}
    for bwv, entry in chorales.ChoraleListRKBWV().byBWV.items():
        if entry.get("title"):
            titles[str(bwv)] = clean_title(entry["title"])
    for bwv, entry in chorales.ChoraleList().byBWV.items():
        if entry.get("title"):
            titles.setdefault(str(bwv), clean_title(entry["title"]))
    # Source variants of one movement ('248.23-2' and '248.23-s') share the title.
    for bwv, title in sorted(titles.items(), key=lambda kv: natural_key(kv[0])):
        titles.setdefault(bwv_base(bwv), title)
    return titles


def bwv_of(cid):
    """'bach/bwv248.23-2.mxl' -> '248.23-2'."""
    stem = Path(cid).stem
    return stem[3:] if stem.lower().startswith("bwv") else stem


def bwv_base(bwv):
    """Catalogue entry without the source/variant suffix: '248.23-2' -> '248.23'."""
    return bwv.split("-")[0]


def lyric_incipit(soprano):
    """First line of the sung text, up to the first punctuation."""
    words = []
    for n in soprano.recurse().notes:
        for lyric in n.lyrics:
            if lyric.number != 1 or not lyric.text:
                continue
            text = lyric.text.strip()
            if lyric.syllabic in ("middle", "end") and words:
                words[-1] += text
            else:
                words.append(text)
            if re.search(r"[,.;:!?]$", text) or len(words) >= 8:
                return re.sub(r"[,.;:!?]+$", "", " ".join(words)).replace("\u2019", "'")
    return " ".join(words) or None


def clean_title(title):
    title = title.replace("\u2019", "'").strip()
    return re.sub(r"^([A-Z])\1([a-z])", r"\1\2", title)   # catalogue typo 'AAch Gott'


def ascii_words(text):
    text = unicodedata.normalize("NFKD", text.replace("ß", "ss").replace("'", ""))
    text = "".join(c for c in text if not unicodedata.combining(c))
    return re.findall(r"[a-z0-9]+", text.lower())


def slug(text):
    return "-".join(ascii_words(text))


def title_keys(title):
    """Spelling-insensitive keys of a hymn title: the whole title and its first four words.

    'Christ lag in Todes Banden' = 'Christ lag in Todesbanden'; 'Gott sei uns gnädig' =
    'Gott sei uns gnädig und barmherzig'.  The four-word key merges a few different hymns
    with a common opening too, which only makes the split coarser.
    """
    words = ascii_words(title)
    return [("title", "".join(words)), ("incipit", "".join(words[:4]))]


def key_name(key):
    """music21 tonic 'B-' -> 'Bb'."""
    return key.tonic.name.replace("-", "b")


def melody_signature(tokens):
    """Transposition-invariant soprano melody: its sequence of intervals between onsets."""
    onsets = [int(t) for t in tokens[0] if t >= PITCH_BASE]
    return tuple(b - a for a, b in zip(onsets, onsets[1:]))


class Groups:
    """Union-find over chorales: same BWV entry, same title, same melody, same tokens."""

    def __init__(self, n):
        self.parent = list(range(n))

    def find(self, i):
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i, j):
        a, b = self.find(i), self.find(j)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


def assign_groups(records):
    groups = Groups(len(records))
    seen = {}
    for i, rec in enumerate(records):
        keys = [("bwv", bwv_base(rec["bwv"])), ("tokens", rec["digest"])]
        if rec["title"]:
            keys += title_keys(rec["title"])
        if len(rec["melody"]) >= 8:
            keys.append(("melody", rec["melody"]))
        for key in keys:
            if key in seen:
                groups.union(seen[key], i)
            else:
                seen[key] = i
    members = collections.defaultdict(list)
    for i in range(len(records)):
        members[groups.find(i)].append(i)
    labels = {}
    for root, idx in members.items():
        titled = sorted((slug(records[i]["title"]), records[i]["title"])
                        for i in idx if records[i]["title"])
        if titled:
            labels[root] = titled[0][0]
            for i in idx:   # untitled member joined by its melody: caption with the tune's name
                if not records[i]["title"]:
                    records[i]["caption"] = titled[0][1]
        else:
            labels[root] = "bwv-" + sorted((bwv_base(records[i]["bwv"]) for i in idx),
                                           key=natural_key)[0]
    return [labels[groups.find(i)] for i in range(len(records))]


# ---------------------------------------------------------------- conversion

def convert_one(cid, path, titles, stats):
    from music21 import bar, converter

    score = converter.parse(str(path))
    voices, how = identify_voices(score)
    if voices is None:
        return None, how
    stats[f"voices identified by part {how}"] += 1

    pad = to_frame(pickup_quarters(voices[0]))
    if pad:
        stats["pickup bars padded with rests"] += 1
    length = pad + to_frame(score.highestTime)
    rows = [voice_tokens(part, voice, pad, length, stats) for part, voice in zip(voices, VOICES)]
    tokens = np.stack(rows).astype(np.int16)
    last = np.max(np.nonzero((tokens != REST).any(axis=0))[0]) if (tokens != REST).any() else -1
    tokens = tokens[:, :last + 1]   # no trailing all-rest frames
    if tokens.shape[1] == 0:
        return None, "no notes"

    soprano = voices[0]
    signatures = [ts.ratioString for ts in soprano.recurse().getElementsByClass("TimeSignature")]
    if len(set(signatures)) > 1:
        stats["time signature changes (first one recorded)"] += 1
    key_signatures = [ks.sharps for ks in soprano.recurse().getElementsByClass("KeySignature")]
    if len(set(key_signatures)) > 1:
        stats["key signature changes (one key recorded)"] += 1
    measures = list(soprano.getElementsByClass("Measure"))
    if any(isinstance(m.leftBarline, bar.Repeat) or isinstance(m.rightBarline, bar.Repeat)
           for m in measures):
        stats["repeat signs (not expanded)"] += 1
    if any(sp.classes[0] == "RepeatBracket" for sp in score.recurse().getElementsByClass("Spanner")) \
            or any(b.classes[0] == "RepeatBracket" for b in soprano.spannerBundle):
        stats["first/second endings (both kept, in written order)"] += 1

    key = score.analyze("key")
    bwv = bwv_of(cid)
    title = titles.get(bwv) or titles.get(bwv_base(bwv))
    caption = title or lyric_incipit(soprano) or f"Chorale BWV {bwv}"
    if not title:
        stats["no catalogue title (caption from lyrics or BWV)"] += 1
    return {
        "cid": cid,
        "bwv": bwv,
        "title": title,
        "caption": caption,
        "key": key_name(key),
        "mode": key.mode,
        "time_signature": signatures[0] if signatures else "4/4",
        "tokens": tokens,
        "melody": melody_signature(tokens),
        "digest": hashlib.sha256(tokens.tobytes() + bytes(str(tokens.shape), "ascii")).hexdigest(),
    }, None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, type=Path,
                        help="folder for <name>.npy files and metadata.jsonl")
    parser.add_argument("--limit", type=int, default=None,
                        help="stop after this many converted chorales")
    args = parser.parse_args(argv)

    import music21
    from music21 import common, corpus

    corpus_root = Path(common.getCorpusFilePath())
    listed = corpus.getComposer("bach")
    files_listed = len(listed)
    sources, skipped = list_sources(corpus_root, listed)
    if not sources:
        sys.exit("no Bach files in music21's corpus (is music21 installed with its corpus?)")
    titles = catalog_titles()
    stats = collections.Counter()
    records = []
    for cid, path in sources:
        if args.limit is not None and len(records) >= args.limit:
            break
        try:
            record, reason = convert_one(cid, path, titles, stats)
        except Exception as error:   # report and keep going
            record, reason = None, f"conversion failed: {type(error).__name__}: {error}"
        if record is None:
            skipped.append((cid, reason))
        else:
            records.append(record)
        print(f"  {cid}: " + (reason and f"skipped ({reason})"
                              or f"{record['tokens'].shape[1]} frames"), file=sys.stderr)
    skipped.sort(key=lambda item: natural_key(item[0]))
    if not records:
        sys.exit("nothing converted")

    groups = assign_groups(records)
    args.output.mkdir(parents=True, exist_ok=True)
    names = set()
    with open(args.output / "metadata.jsonl", "w", encoding="utf-8") as meta:
        for record, group in zip(records, groups):
            name = f"bwv{record['bwv']}.npy"
            assert name not in names
            names.add(name)
            np.save(args.output / name, record["tokens"])
            meta.write(json.dumps({
                "file": name,
                "id": record["cid"],
                "title": record["caption"],
                "caption": chorale_caption(record["key"], record["mode"], record["time_signature"],
                                           bars(record["tokens"].shape[1], record["time_signature"]),
                                           record["caption"]),
                "attributes": {
                    "key": record["key"],
                    "mode": record["mode"],
                    "time_signature": record["time_signature"],
                    "bwv": record["bwv"],
                },
                "group": group,
            }, ensure_ascii=False) + "\n")
    stale = sorted(p.name for p in args.output.glob("*.npy") if p.name not in names)

    # ------------------------------------------------------------ summary
    tokens = [r["tokens"] for r in records]
    frames = sum(t.shape[1] for t in tokens)
    onsets = np.concatenate([t.ravel() for t in tokens])
    onsets = onsets[onsets >= PITCH_BASE]
    print(f"music21 {music21.__version__}: {files_listed} files under the corpus's bach/ folder")
    print(f"converted: {len(records)} chorales -> {args.output}")
    print(f"skipped:   {len(skipped)}")
    reasons = collections.Counter(re.sub(r" \(.*\)$|: .*$| of .*$", "", reason) for _, reason in skipped)
    for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {count:4d}  {reason}")
    for cid, reason in skipped:
        print(f"    {cid}: {reason}")
    print(f"total frames: {frames} (x4 voices = {4 * frames} tokens), "
          f"{frames / FRAMES_PER_QUARTER:.0f} quarter notes, "
          f"{frames / FRAME_RATE / 3600:.2f} h at {FRAME_RATE:g} frames/s")
    lengths = sorted(t.shape[1] for t in tokens)
    print(f"frames per chorale: min {lengths[0]}, median {lengths[len(lengths) // 2]}, max {lengths[-1]}")
    print(f"pitch range: MIDI {token_pitch(int(onsets.min()))}..{token_pitch(int(onsets.max()))} "
          f"(vocabulary allows {LOWEST}..{HIGHEST})")
    for v, voice in enumerate(VOICES):
        row = np.concatenate([t[v] for t in tokens])
        row = row[row >= PITCH_BASE]
        print(f"  {voice:8s} MIDI {token_pitch(int(row.min()))}..{token_pitch(int(row.max()))}")
    print(f"vocabulary: {VOCAB} tokens (0 rest, 1 hold, 2..{VOCAB - 1} onsets), card C = {CARD}, "
          f"frame rate {FRAME_RATE:g} (sixteenths at quarter = {NOMINAL_QUARTER_BPM:g} bpm)")
    print(f"groups: {len(set(groups))} (largest: {collections.Counter(groups).most_common(1)[0]})")
    duplicates = len(records) - len({r['digest'] for r in records})
    print(f"exact duplicate token arrays: {duplicates} (kept, same group)")
    modes = collections.Counter(r["mode"] for r in records)
    print(f"modes: {dict(sorted(modes.items()))}")
    for what, count in sorted(stats.items()):
        print(f"  {what}: {count}")
    if stale:
        print(f"warning: {len(stale)} .npy files in {args.output} are not in metadata.jsonl "
              f"(from an earlier run): {', '.join(stale[:5])}{' ...' if len(stale) > 5 else ''}")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from check import print_unigram_baseline
    print_unigram_baseline(tokens)


if __name__ == "__main__":
    main()
