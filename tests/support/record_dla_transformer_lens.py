"""Record TransformerLens's direct logit attribution on tiny seeded models, for tests/test_dla_reference.py.

TransformerLens is heavy (pandas, datasets, wandb) and is not a dependency of the project: run this in its own venv,
with the project's torch and transformers versions (the seeded weights are the same in any version)::

    python3 -m venv /work/venv-tl
    /work/venv-tl/bin/pip install torch==2.13.0 transformers==5.24.0 transformer-lens   # 4.3.0 when recorded
    cd tests && HF_HUB_OFFLINE=1 /work/venv-tl/bin/python support/record_dla_transformer_lens.py

It writes tests/data/dla_transformer_lens.json: per family TransformerLens loads (its ``TransformerBridge`` on the
seeded transformers model, ``enable_compatibility_mode(no_processing=True)``: fold_ln, center_writing_weights and
center_unembed all off), the model's fingerprint, the token ids, the pair (A = the top token at the last position,
B = the runner-up), and the attribution of every head (``ActivationCache.stack_head_results``), every attention and
MLP output and the embeddings (``decompose_resid``), each through ``apply_ln_to_stack`` (the final norm's frozen
scale; the norm's weight, not folded, is applied to the direction ``W_U[A] − W_U[B]`` here).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent)]

from support.seeded_models import FAMILIES, fingerprint, seeded_model  # noqa: E402
from support.tiny_models import build_tokenizer  # noqa: E402

SEED = 7
IDS = [1, 40, 50, 60, 70, 80, 90, 100]
OUT = HERE.parent / "data" / "dla_transformer_lens.json"


def record(family: str) -> dict:
    from transformer_lens.model_bridge import TransformerBridge

    model = seeded_model(family, SEED)
    printed = fingerprint(model)  # before the bridge wraps the modules (and renames the parameters)
    folder = tempfile.mkdtemp()
    model.config.save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    final_norm = dict(model.named_modules())[_final_norm_name(model)]
    bridge = TransformerBridge.boot_transformers(folder, hf_model=model)
    bridge.enable_compatibility_mode(no_processing=True)
    ids = torch.tensor([IDS])
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(ids)
        last = logits[0, -1].double()
        a, b = last.topk(2).indices.tolist()
        head = model.get_output_embeddings().weight.double()
        weight = final_norm.weight.double()
        if family.startswith("gemma"):
            weight = 1 + weight
        u = (head[a] - head[b]) * weight  # [d_model]
        heads = cache.stack_head_results(layer=-1, pos_slice=-1)  # [layers * heads, 1, d_model]
        per_head = (cache.apply_ln_to_stack(heads, layer=-1, pos_slice=-1)[:, 0].double() @ u).tolist()
        parts, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
        per_part = (cache.apply_ln_to_stack(parts, layer=-1, pos_slice=-1)[:, 0].double() @ u).tolist()
    n_heads = model.config.num_attention_heads
    return {"family": family, "seed": SEED, "fingerprint": printed, "ids": IDS, "token": a,
            "against": b, "difference": float(last[a] - last[b]),
            "heads": [per_head[i:i + n_heads] for i in range(0, len(per_head), n_heads)],
            "components": dict(zip(labels, per_part, strict=True))}


def _final_norm_name(model: torch.nn.Module) -> str:
    names = [n for n, _ in model.named_modules() if n.endswith(("model.norm", "ln_f", "final_layer_norm"))]
    return names[0]


def main() -> None:
    from importlib.metadata import version

    import transformer_lens  # noqa: F401  (fails here, before any work, outside its venv)

    cases, skipped = [], {}
    for family in FAMILIES:
        try:
            cases.append(record(family))
            print(family, "recorded")
        except Exception as error:  # a family TransformerLens does not load: said in the file
            skipped[family] = f"{type(error).__name__}: {str(error)[:200]}"
            print(family, "skipped:", skipped[family])
    OUT.write_text(json.dumps({"transformer_lens": version("transformer-lens"), "torch": torch.__version__,
                               "transformers": version("transformers"), "cases": cases, "skipped": skipped},
                              indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
