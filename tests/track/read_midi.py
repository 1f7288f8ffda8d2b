#!/usr/bin/env python3
"""Reads a Standard MIDI File with PyPI's mido (an implementation independent of etude's writer)
and prints what it found as JSON, for tests/track/midi.cpp.

  read_midi.py FILE

Output: {"type", "ticks_per_beat", "length_s",
         "tracks": [{"name", "end_tick", "tempos": [[tick, us]], "time_signatures": [[tick, n, d]],
                     "programs": [[tick, channel, program]],
                     "notes": [[channel, pitch, velocity, start_tick, end_tick]]}],
         "played": [[channel, pitch, start_s, end_s]]}
"notes" pairs each note_on with the next note_off (or note_on of velocity 0) of its channel and
pitch within a track; "played" does the same over the merged playback in seconds, as mido's
player times it with the file's tempo. Exit status 77: mido cannot be imported (the caller skips).
"""
import json
import sys

try:
    import mido
except Exception as e:  # ImportError, or a broken install
    print("cannot import mido (%s: %s); install it with: python3 -m pip install mido"
          % (type(e).__name__, e), file=sys.stderr)
    sys.exit(77)


def pair_notes(messages, time_of):
    """[[channel, pitch, velocity, start, end]] from (message, time) pairs."""
    open_notes, notes = {}, []
    for msg, t in messages:
        if msg.type == "note_on" and msg.velocity > 0:
            if (msg.channel, msg.note) in open_notes:
                raise SystemExit("note %d on channel %d struck again while sounding" % (msg.note, msg.channel))
            open_notes[(msg.channel, msg.note)] = (msg.velocity, t)
        elif msg.type in ("note_off", "note_on"):
            key = (msg.channel, msg.note)
            if key not in open_notes:
                raise SystemExit("note_off without a note_on: %r" % msg)
            velocity, start = open_notes.pop(key)
            notes.append([msg.channel, msg.note, velocity, time_of(start), time_of(t)])
    if open_notes:
        raise SystemExit("notes never released: %r" % sorted(open_notes))
    return notes


def main():
    mid = mido.MidiFile(sys.argv[1])  # mido raises on a malformed chunk or event
    out = {"type": mid.type, "ticks_per_beat": mid.ticks_per_beat, "length_s": mid.length, "tracks": []}
    for track in mid.tracks:
        tick, timed = 0, []
        info = {"name": track.name, "tempos": [], "time_signatures": [], "programs": []}
        for msg in track:
            tick += msg.time
            timed.append((msg, tick))
            if msg.type == "set_tempo":
                info["tempos"].append([tick, msg.tempo])
            elif msg.type == "time_signature":
                info["time_signatures"].append([tick, msg.numerator, msg.denominator])
            elif msg.type == "program_change":
                info["programs"].append([tick, msg.channel, msg.program])
        if not track or track[-1].type != "end_of_track":
            raise SystemExit("track %r does not end with end_of_track" % track.name)
        info["end_tick"] = tick
        info["notes"] = pair_notes(timed, lambda t: t)
        out["tracks"].append(info)
    now, played = 0.0, []
    for msg in mid:  # playback order, times in seconds
        now += msg.time
        if not msg.is_meta:
            played.append((msg, now))
    out["played"] = [[c, p, s, e] for c, p, _, s, e in pair_notes(played, lambda t: t)]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
