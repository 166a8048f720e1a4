"""Records transformers 4.46's contrastive search (``generate(penalty_alpha=α, top_k=k)``, in its core before it
moved to the Hub) for tests/test_contrastive_search_reference.py. Run with the separate transformers 4.46 venv
(tests/support/record_dola_446.py says how it was made):

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 /work/venv446/bin/python tests/support/record_contrastive_search_446.py \\
        ~/.cache/decoding-playground/models/SmolLM2-135M-Instruct tests/data/contrastive_search_4_46.json [--tiny-only]

(``--tiny-only`` keeps the file's default-model cases and re-records only the tiny models'.)

The default model (float32, no chat template): for each prompt its token ids, greedy's tokens (the test first
checks that our greedy equals them, so the load is right) and contrastive search's for each (α, k). 4.46 does not
read a 5.x ``config.json``'s ``rope_parameters``: ``rope_theta`` is set from it by hand (else 4.46 would use 10,000).

Tiny models of the families 4.46 runs it on (``TINY_FAMILIES``: all it has of the project's nine but Gemma 2, whose
hybrid cache it refuses, as the record's ``refused`` says; Mistral with a window the text crosses): built from the
same config in both versions and filled from a seed (tests/support/seeded_models.py), so nothing big is stored;
their prompts are ids of tests/support/tiny_models' tokenizer (the test checks that it encodes the texts to them);
no EOS (they run to the length). Each tiny case records the weights' fingerprint, which the test checks first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.seeded_models import PAD, fingerprint, seeded_model  # tests/ on the path first; no playground import

PROMPTS = (
    "The capital of Australia is",
    "Once upon a time, there was a little robot who",
    "The best way to learn a new language is",
)
SETTINGS = ((0.6, 4), (0.4, 6), (0.8, 3))  # (penalty_alpha, top_k)
NEW_TOKENS = 24
# tests/support/tiny_models.build_tokenizer()'s ids of these texts
TINY_PROMPTS = {
    "The capital of France is Paris. The weather": [282, 279, 67, 82, 75, 86, 283, 301, 223, 40, 84, 262, 69, 71, 303,
                                                    223, 50, 67, 84, 291, 16, 223, 282, 305, 267, 260, 84],
}
TINY_SETTINGS = ((0.6, 4), (0.3, 5))
TINY_NEW_TOKENS = 20
SEED = 0
TINY_FAMILIES = ("llama", "qwen2", "mistral", "phi3", "gpt2", "gpt_neox")
REFUSED = ("gemma2",)  # tried: 4.46 refuses them; the record keeps its message (the tests compare them by hand)


def generate(model, ids: torch.Tensor, tokens: int, pad: int, **extra) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=tokens, pad_token_id=pad, temperature=None,
                             top_p=None, **extra)
    return out[0, ids.shape[1]:].tolist()


def default_cases(folder: str) -> tuple[list[dict], float]:
    config = LlamaConfig.from_pretrained(folder)
    raw = json.loads((Path(folder) / "config.json").read_text())
    config.rope_theta = raw["rope_parameters"]["rope_theta"]
    model = LlamaForCausalLM.from_pretrained(folder, config=config, torch_dtype=torch.float32).eval()
    # 4.46 cannot read a 5.x tokenizer_config.json (class TokenizersBackend): the tokenizer.json itself
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(folder) / "tokenizer.json"), eos_token="<|im_end|>")
    cases = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        pad = tokenizer.eos_token_id
        case = {"prompt": prompt, "prompt_ids": ids[0].tolist(),
                "greedy_ids": generate(model, ids, NEW_TOKENS, pad, top_k=None), "search": []}
        for alpha, k in SETTINGS:
            found = generate(model, ids, NEW_TOKENS, pad, penalty_alpha=alpha, top_k=k)
            case["search"].append({"penalty_alpha": alpha, "top_k": k, "ids": found, "text": tokenizer.decode(found)})
        cases.append(case)
        print(json.dumps(case, ensure_ascii=False), flush=True)
    return cases, config.rope_theta


def tiny_cases() -> list[dict]:
    cases = []
    for family in TINY_FAMILIES:
        model = seeded_model(family, SEED)
        model.generation_config.eos_token_id = None  # run to the length
        for text, prompt_ids in TINY_PROMPTS.items():
            ids = torch.tensor([prompt_ids])
            case = {"family": family, "seed": SEED, "fingerprint": fingerprint(model), "prompt": text,
                    "prompt_ids": prompt_ids, "greedy_ids": generate(model, ids, TINY_NEW_TOKENS, PAD, top_k=None),
                    "search": [{"penalty_alpha": a, "top_k": k,
                                "ids": generate(model, ids, TINY_NEW_TOKENS, PAD, penalty_alpha=a, top_k=k)}
                               for a, k in TINY_SETTINGS]}
            cases.append(case)
            print(family, case["search"], flush=True)
    return cases


def refusals() -> dict[str, str]:
    """What 4.46 says when asked for contrastive search on ``REFUSED``'s families (Gemma 2: its hybrid cache)."""
    said = {}
    for family in REFUSED:
        try:
            generate(seeded_model(family, SEED), torch.tensor([[282, 279]]), 2, PAD, penalty_alpha=0.6, top_k=4)
        except Exception as error:  # the message is what is recorded
            said[family] = f"{type(error).__name__}: {error}"
        else:
            raise AssertionError(f"4.46 ran contrastive search on {family}: record it in TINY_FAMILIES")
    return said


def main(folder: str, out: str, *flags: str) -> None:
    torch.manual_seed(0)
    if "--tiny-only" in flags:  # keep the record's default-model cases, re-record the tiny ones
        record = json.loads(Path(out).read_text())
        record.update(command=" ".join(["python", *sys.argv]), tiny_max_new_tokens=TINY_NEW_TOKENS, tiny=tiny_cases(),
                      refused=refusals())
        Path(out).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        return
    cases, rope_theta = default_cases(folder)
    record = {"source": "transformers.generation.utils GenerationMixin._contrastive_search (transformers 4.46)",
              "command": " ".join(["python", *sys.argv]),
              "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
              "model": Path(folder).name, "rope_theta": rope_theta, "chat": False, "max_new_tokens": NEW_TOKENS,
              "cases": cases, "tiny_max_new_tokens": TINY_NEW_TOKENS, "tiny": tiny_cases(),
              "refused": refusals()}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
