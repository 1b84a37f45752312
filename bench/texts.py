"""The generated English sentences every benchmark measures on, the same every run; no dependencies, so that an
environment of other libraries (bench/cpu_peers.py) reads the same texts."""

from __future__ import annotations

import random

WORDS = """the of and to in is was that for it with as his on be at by had are but from or have an they which
one you were her all she there would their we him been has when who will more no if out so said what up its
about into than them can only other new some could time these two may then do first any my now such like our
over man me even most made after also did many before must through back years where much your way well down
should because each just those people how too little state good very make world still own see men work long get
here between both life being under never day same another know while last might us great old year off come since
against go came right used take three house city river garden music dog cat morning evening quickly slowly bright
quiet ancient modern small large green blue heavy light storm train station market library teacher student
window table letter story question answer paper model language machine learning network attention token vector
""".split()


def make_sentences(n: int = 2000, seed: int = 0) -> list[str]:
    """n English-word sentences of 8 to 40 words, the same every run."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 40))]
        for i in range(3, len(words) - 2, rng.randint(6, 12)):
            words[i] += ","
        sentences.append((" ".join(words)).capitalize() + rng.choice(".?!"))
    return sentences
