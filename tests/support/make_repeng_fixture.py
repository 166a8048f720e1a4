"""Makes tests/data/repeng_tiny_llama.gguf (a control vector repeng 0.4.0 trained and exported) and
tests/data/repeng_tiny_llama_logits.safetensors (repeng's own steered and unsteered logits), for
tests/test_steering_repeng.py. repeng 0.4.0 does not import under NumPy 2, so it runs in a separate venv:

    python3 -m venv /tmp/repeng-venv
    /tmp/repeng-venv/bin/pip install 'numpy<2' torch==2.13.0 repeng==0.4.0   # torch: the CPU build on disk
    OMP_NUM_THREADS=1 PYTHONPATH=.:tests /tmp/repeng-venv/bin/python -m support.make_repeng_fixture

(from the repository root: ``tests/support/tiny_models.py`` builds the model, so the test rebuilds the same one).

The model is ``build_tiny_lm(seed=0, layers=4)`` (a 4-block, 32-wide random LlamaForCausalLM with the tests'
320-token tokenizer). ``ControlVector.train`` with repeng's defaults (``pca_diff`` at the last token of each
example; blocks 3, 2, 1, i.e. every block but the first) on the pairs below; ``export_gguf`` writes the vector.
Then repeng's ``ControlModel`` over blocks 1 to 3 with ``set_control(vector, COEFF)`` gives the steered logits of
PROMPT_IDS, and ``reset()`` the unsteered ones (the test checks its rebuilt model against these first).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

PAIRS = (
    ("The weather in Shanghai is sunny today.", "The weather in Shanghai is cold today."),
    ("I would like a cup of coffee.", "I would like a cup of water."),
    ("Greedy takes the most likely token.", "Sampling draws from the distribution."),
    ("The capital of France is Paris.", "The capital of France is Shanghai."),
    ("Beam search keeps several hypotheses.", "Speculative decoding drafts tokens."),
    ("Quantization stores weights in fewer bits.", "Language models predict the next token."),
)
COEFF = 4.0
LAYERS = (1, 2, 3)
PROMPT = "The weather in Paris is"


def main(out_dir: Path) -> int:
    import repeng
    from repeng import ControlModel, ControlVector, DatasetEntry
    from safetensors.torch import save_file

    from support.tiny_models import build_tiny_lm

    lm = build_tiny_lm(seed=0, layers=4)
    model, tokenizer = lm.model, lm.tokenizer
    dataset = [DatasetEntry(positive=p, negative=n) for p, n in PAIRS]
    vector = ControlVector.train(model, tokenizer, dataset)
    assert sorted(vector.directions) == list(LAYERS), vector.directions.keys()
    out_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = out_dir / "repeng_tiny_llama.gguf"
    vector.export_gguf(str(gguf_path))

    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    controlled = ControlModel(model, list(LAYERS))
    with torch.inference_mode():
        controlled.set_control(vector, COEFF)
        steered = controlled(input_ids=ids).logits[0].float()
        controlled.reset()
        unsteered = controlled(input_ids=ids).logits[0].float()
    controlled.unwrap()
    meta = {"coeff": str(COEFF), "layers": ",".join(map(str, LAYERS)), "prompt": PROMPT,
            "repeng": getattr(repeng, "__version__", "0.4.0"), "numpy": np.__version__, "torch": torch.__version__}
    save_file({"input_ids": ids[0], "steered": steered.contiguous(), "unsteered": unsteered.contiguous()},
              str(out_dir / "repeng_tiny_llama_logits.safetensors"), metadata=meta)
    print(f"{gguf_path} ({gguf_path.stat().st_size} bytes); steered vs unsteered max |Δlogit| "
          f"{float((steered - unsteered).abs().max()):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tests/data")))
