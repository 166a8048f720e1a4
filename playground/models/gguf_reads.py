"""Loading one ``.gguf`` file reads it once: transformers reads the file's metadata three times (the config, the
tokenizer, the weights: each a full ``GGUFReader`` pass over every field, ~300,000 small numpy views for SmolLM2's
vocabulary) and builds gguf-py's tensor-name table once per module of the model (397 times for SmolLM2, each the
same table). Both are pure reads of the same inputs; inside ``gguf_read_once`` each is made once and reused.

Measured on SmolLM2-135M-Instruct's Q4_1 GGUF (2 loaded cores, cProfile): of 193 s, 84 s were the three reader
passes and 41 s the 397 name tables; ``benchmarks/bench_gguf_load.py`` gives the figure on an idle machine.

The two names are swapped in the ``gguf`` module, which transformers imports from at each call; one lock keeps
two loads from swapping them at once (a second GGUF load waits for the first; loads of folders never touch them).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_LOCK = threading.Lock()


@contextmanager
def gguf_read_once() -> Iterator[None]:
    """While inside: one ``GGUFReader`` per (file, mode) and one tensor-name table per (architecture, blocks)."""
    import gguf

    with _LOCK:
        make_reader, make_names = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict[tuple[str, str], Any] = {}
        names: dict[tuple[Any, int], Any] = {}

        def reader(path: Any, mode: Any = "r") -> Any:
            key = (os.path.realpath(os.fspath(path)), mode)
            if key not in readers:
                readers[key] = make_reader(path, mode)
            return readers[key]

        def name_map(arch: Any, n_blocks: int) -> Any:
            if (arch, n_blocks) not in names:
                names[arch, n_blocks] = make_names(arch, n_blocks)
            return names[arch, n_blocks]

        setattr(gguf, "GGUFReader", reader)  # noqa: B010  (setattr: the module's names, swapped for a while)
        setattr(gguf, "get_tensor_name_map", name_map)  # noqa: B010
        try:
            yield
        finally:
            setattr(gguf, "GGUFReader", make_reader)  # noqa: B010
            setattr(gguf, "get_tensor_name_map", make_names)  # noqa: B010
            readers.clear()  # their memory maps close with them
