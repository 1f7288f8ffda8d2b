"""The chorales' caption rule: one sentence built from what is known of each piece.

    A chorale in G minor, 4/4, 12 bars: Meine Seel' erhebt den Herren

Used by convert.py (the "caption" it writes) and by tools/embed_captions.py --chorale-captions
(to rebuild captions of metadata written before the rule).  Not for: embedding the text.
"""

import math

FRAMES_PER_QUARTER = 4   # one frame per sixteenth note (docs/chorales.md, "Grid")


def frames_per_bar(time_signature):
    """Frames in one bar of a time signature such as "4/4", "3/4" or "3/2"."""
    beats, unit = (int(x) for x in time_signature.split("/"))
    return beats * FRAMES_PER_QUARTER * 4 // unit


def bars(frames, time_signature):
    """Bars spanned by `frames` frames: a pickup is padded to a whole bar, so frame 0 is a
    downbeat, and a final incomplete bar counts as a bar."""
    return math.ceil(frames / frames_per_bar(time_signature))


def chorale_caption(key, mode, time_signature, n_bars, title):
    """ "A chorale in <key> <mode>, <meter>, <n> bars: <title>" """
    unit = "bar" if n_bars == 1 else "bars"
    return f"A chorale in {key} {mode}, {time_signature}, {n_bars} {unit}: {title}"
