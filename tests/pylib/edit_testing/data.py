"""Training data for tests and smoke runs, generated here (no download)."""
import os
import random
import subprocess

from . import paths


def make_data(d, edit_data=None):
    """A small English-like corpus as llm.c token files d/train.bin and d/val.bin (written
    by edit-data encode); returns their paths. The same seed every time: the same files."""
    words = ("the of and to in a is that for it as was with be by on not he this are or his "
             "from at which but have an they you were her she there been one all we their").split()
    rng = random.Random(5)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) + "." for _ in range(6000)]
    text = os.path.join(d, "text.txt")
    with open(text, "w") as f:
        f.write("\n".join(lines))
    train, val = os.path.join(d, "train.bin"), os.path.join(d, "val.bin")
    subprocess.run([edit_data or paths.EDIT_DATA, "encode", "--in", text, "--train", train, "--val", val],
                   check=True, capture_output=True)
    return train, val
