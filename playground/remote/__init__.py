"""Remote models: runs streamed from an OpenAI-compatible server (llama.cpp's llama-server, vLLM, ...).

Qt-free and torch-free: a remote run never loads torch. ``run_remote`` (``decode.py``) yields the same events as a
local greedy/sampling run; ``RemoteSource`` (``source.py``) says where the server is; every failure is a
``RemoteError`` (``errors.py``) whose message says what to do.
"""

from playground.remote.errors import RemoteError
from playground.remote.source import RemoteSource

__all__ = ["RemoteError", "RemoteSource"]
