"""Records transformers 4.46's DoLa (the authors' code, as transformers shipped it before moving it to the Hub) on
the default model, for tests/test_dola_reference.py. Run with a separate venv holding transformers 4.46 (not the
project's, which has 5.x):

    python3 -m venv /work/venv446
    /work/venv446/bin/pip install torch==2.13.0          # first: a CPU build (else pip picks a 5.5 GB CUDA one)
    /work/venv446/bin/pip install 'transformers==4.46.3'
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 /work/venv446/bin/python tests/support/record_dola_446.py \\
        ~/.cache/decoding-playground/models/SmolLM2-135M-Instruct tests/data/dola_transformers_4_46.json

For each prompt (no chat template) it writes the prompt's token ids, greedy's tokens (no DoLa: the test first checks
that our engine's greedy equals them, so the load is right) and ``generate(dola_layers=bucket,
repetition_penalty=1.2, do_sample=False, max_new_tokens=N)``'s tokens for both buckets, with their texts and the
versions used. transformers 4.46 does not read a 5.x ``config.json``'s ``rope_parameters``: ``rope_theta`` is set from
it by hand (else 4.46 would use 10,000).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PROMPTS = (
    "The capital of Australia is",
    "The first person to walk on the moon was",
    "Water boils at a temperature of",
    "The largest planet in the solar system is",
    "In 1492, Christopher Columbus",
    "The author of Pride and Prejudice is",
)
BUCKETS = ("low", "high")
NEW_TOKENS = 20
REPETITION_PENALTY = 1.2


def main(folder: str, out: str) -> None:
    torch.manual_seed(0)
    config = LlamaConfig.from_pretrained(folder)
    raw = json.loads((Path(folder) / "config.json").read_text())
    config.rope_theta = raw["rope_parameters"]["rope_theta"]
    model = LlamaForCausalLM.from_pretrained(folder, config=config, torch_dtype=torch.float32).eval()
    # 4.46 cannot read a 5.x tokenizer_config.json (class TokenizersBackend): the tokenizer.json itself
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(folder) / "tokenizer.json"), eos_token="<|im_end|>")
    cases = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        common = {"do_sample": False, "max_new_tokens": NEW_TOKENS, "pad_token_id": tokenizer.eos_token_id,
                  "temperature": None, "top_p": None, "top_k": None}
        with torch.no_grad():
            greedy = model.generate(ids, **common)[0, ids.shape[1]:].tolist()
            dola = {bucket: model.generate(ids, dola_layers=bucket, repetition_penalty=REPETITION_PENALTY,
                                           **common)[0, ids.shape[1]:].tolist() for bucket in BUCKETS}
        case = {"prompt": prompt, "prompt_ids": ids[0].tolist(), "greedy_ids": greedy,
                "greedy_text": tokenizer.decode(greedy),
                "dola": {b: {"ids": dola[b], "text": tokenizer.decode(dola[b])} for b in BUCKETS}}
        cases.append(case)
        print(json.dumps(case, ensure_ascii=False), flush=True)
    record = {"source": "transformers.generation.utils GenerationMixin._dola_decoding (transformers 4.46)",
              "command": " ".join(["python", *sys.argv]),
              "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
              "model": Path(folder).name, "rope_theta": config.rope_theta, "chat": False,
              "max_new_tokens": NEW_TOKENS, "repetition_penalty": REPETITION_PENALTY, "cases": cases}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
