#!/usr/bin/env python3
"""Tokenizes a public-domain text into token shards in llm.c's format (include/trident/data).

The default text is the King James Bible from Debian's bible-kjv packages (public domain;
installed with apt-get when missing and run as root). The tokenizer is byte-level: token =
byte, vocabulary 256, so nothing needs to be downloaded or trained. The last --val-fraction of
the text becomes the validation shard.

    python3 scripts/prepare_data.py --out data            # data/kjv_train.bin, data/kjv_val.bin
    python3 scripts/prepare_data.py --text my.txt --out data --name mine

Shards: a header of 256 little-endian int32 (magic 20240520, version 1, token count), then the
tokens as little-endian uint16, which is what llm.c's dev/data/data_common.py writes for GPT-2.
"""
import argparse
import os
import re
import shutil
import struct
import subprocess
import sys

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256


def write_shard(path, tokens):
    """One shard in llm.c's GPT-2 format (uint16 tokens)."""
    if len(tokens) >= 2**31:
        raise SystemExit(f"prepare_data: {len(tokens)} tokens do not fit one shard's int32 count")
    header = struct.pack("<3i", MAGIC, VERSION, len(tokens)) + bytes(4 * (HEADER_INTS - 3))
    with open(path + ".tmp", "wb") as f:
        f.write(header)
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    os.replace(path + ".tmp", path)  # a reader never sees half a shard
    print(f"prepare_data: wrote {len(tokens):,} tokens to {path}")


def kjv_text():
    """The King James Bible as plain text, from Debian's `bible` program (verse numbers removed)."""
    if shutil.which("bible") is None:
        if os.geteuid() != 0:
            raise SystemExit("prepare_data: the text comes from Debian's bible-kjv packages; run as root, or first:\n"
                             "  apt-get install -y bible-kjv bible-kjv-text")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "bible-kjv", "bible-kjv-text"],
                       check=True, env=env)
    raw = subprocess.run(["bible", "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True).stdout
    text = re.sub(r"(?m)^\s*\d+ ", "", raw)  # "  12 And God said" -> "And God said"
    return text.strip() + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for the shards")
    parser.add_argument("--text", help="a UTF-8 text file to use instead of the King James Bible")
    parser.add_argument("--name", default=None, help="shard name prefix (default: kjv, or the text file's stem)")
    parser.add_argument("--val-fraction", type=float, default=0.05, help="share of the text for validation")
    args = parser.parse_args()
    if not 0.0 < args.val_fraction < 1.0:
        raise SystemExit(f"prepare_data: --val-fraction {args.val_fraction}; expected between 0 and 1")
    if args.text:
        if not os.path.isfile(args.text):
            raise SystemExit(f"prepare_data: --text {args.text}: no such file")
        with open(args.text, "rb") as f:
            data = f.read()
        name = args.name or os.path.splitext(os.path.basename(args.text))[0]
    else:
        data = kjv_text().encode("utf-8")
        name = args.name or "kjv"
    tokens = list(data)  # byte-level: one token per byte
    split = len(tokens) - max(1, int(len(tokens) * args.val_fraction))
    os.makedirs(args.out, exist_ok=True)
    write_shard(os.path.join(args.out, f"{name}_train.bin"), tokens[:split])
    write_shard(os.path.join(args.out, f"{name}_val.bin"), tokens[split:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
