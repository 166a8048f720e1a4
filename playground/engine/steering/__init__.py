"""Activation steering: vectors added to the model's residual stream (``vector``), built from contrast prompts
(``build``), read and written as files (``files``: safetensors here, llama.cpp's control-vector GGUF in
``gguf_files``), and a steered run of any strategy (``run``: the hooks of ``hooks`` and the observer's events).

Torch is imported by the modules themselves; this package's own import is light."""
