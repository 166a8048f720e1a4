"""Records transformers 4.46's diverse (group) beam search (``_group_beam_search`` with
``HammingDiversityLogitsProcessor``, as transformers shipped it before moving it to the Hub) for
tests/test_beam_groups_reference.py. Run with the separate venv holding transformers 4.46 (see record_dola_446.py):

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 /work/venv446/bin/python tests/support/record_group_beam_446.py \\
        ~/.cache/decoding-playground/models/SmolLM2-135M-Instruct tests/data/group_beam_4_46.json [--tiny-only]

(``--tiny-only`` keeps the file's default-model cases and re-records only the tiny models'.)

Two kinds of cases, each ``generate(num_beams=N, num_beam_groups=G, diversity_penalty=D, do_sample=False, ...)``
with ``return_dict_in_generate=True, output_scores=True`` (so ``sequences_scores`` is kept):

- the default model, no chat template; 4.46 does not read a 5.x ``config.json``'s ``rope_parameters``, so
  ``rope_theta`` is set from it by hand (else 4.46 would use 10,000); pad = EOS, as its generation config says;
- tiny models of every family of the project's nine that 4.46 has (seven: Gemma 2 runs here, unlike its
  contrastive search; tests/support/seeded_models.py: the config built by hand, every parameter filled from a seed
  in sorted-name order, so both venvs hold the same weights without a stored file). Their "EOS"
  is a token the model picks (greedy's token at ``EOS_AT``), so that hypotheses finish and groups may end before
  the length limit; pad is 0 or, in half the cases, EOS as in the default model (a done group emits it, and it
  counts for the later groups' penalty).

Each case stores the weights' fingerprint (tiny models), the prompt's ids, the settings, the returned sequences
(generated ids up to and including the first EOS; 4.46 pads the shorter ones), their scores, and the tokens every
group's beams appended at each step but the last (logged from 4.46's Hamming processor, which sees them at the
next step), in the beams' row order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.generation.logits_process import HammingDiversityLogitsProcessor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.seeded_models import PAD, fingerprint, seeded_model  # tests/ on the path first

DEFAULT_PROMPTS = ("The capital of Australia is", "Three ideas for a birthday party:")
# (num_beams, num_beam_groups, diversity_penalty, max_new_tokens, extra generate() arguments)
DEFAULT_CASES = ((4, 2, 2.0, 16, {}), (6, 3, 1.5, 16, {"num_return_sequences": 3}))
# The tiny tokenizer's ids of "The capital of France is" and "Beam search keeps several" (the test checks them).
TINY_PROMPTS = ((282, 279, 67, 82, 75, 86, 283, 301, 223, 40, 84, 262, 69, 71, 303),
                (36, 274, 79, 264, 274, 84, 69, 74, 223, 261, 71, 82, 85, 264, 71, 297, 283))
EOS_AT = 6
# (family, seed, prompt, pad is EOS (as the default model's) or 0, case[, EOS id instead of greedy's token])
TINY_CASES = (
    ("llama", 0, 0, False, (4, 2, 1.0, 20, {})),
    ("llama", 1, 1, True, (6, 3, 2.0, 20, {"num_return_sequences": 4, "length_penalty": 0.5})),
    ("qwen2", 0, 0, True, (4, 4, 0.7, 20, {"repetition_penalty": 1.3})),
    ("phi3", 0, 1, False, (6, 2, 1.5, 20, {"early_stopping": True, "num_return_sequences": 2})),
    ("gpt2", 0, 0, True, (4, 2, 3.0, 20, {"early_stopping": "never", "length_penalty": 2.0})),
    ("gpt_neox", 0, 1, False, (8, 4, 0.4, 18, {"no_repeat_ngram_size": 2, "num_return_sequences": 3})),
    # a repetition penalty after the diversity penalty: the order of the two decides the beams here
    ("gpt2", 0, 0, False, (6, 3, 1.0, 16, {"repetition_penalty": 1.3, "num_return_sequences": 3}), 2),
    # windowed layers the text crosses (seeded_models.WINDOW): Mistral's every layer, Gemma 2's every other one
    ("mistral", 0, 1, False, (4, 2, 1.5, 20, {"num_return_sequences": 2})),
    ("gemma2", 0, 0, True, (6, 3, 1.0, 20, {"length_penalty": 0.5, "num_return_sequences": 3})),
)


def watch_groups(calls: list) -> None:
    """Log what each group's beams chose at the step before: 4.46 calls the Hamming processor once per group and
    step, in the groups' order, with the group's rows, whose last column holds the tokens its beams appended."""
    original = HammingDiversityLogitsProcessor.__call__

    def call(self, input_ids, scores, current_tokens, beam_group_idx):
        calls.append((beam_group_idx, input_ids[:, -1].tolist()))
        return original(self, input_ids, scores, current_tokens, beam_group_idx)

    HammingDiversityLogitsProcessor.__call__ = call


CALLS: list = []


def group_beam(model, ids: torch.Tensor, eos: int, pad: int, case) -> dict:
    beams, groups, penalty, new, extra = case
    CALLS.clear()
    with torch.no_grad():
        out = model.generate(ids, num_beams=beams, num_beam_groups=groups, diversity_penalty=penalty,
                             max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=pad,
                             return_dict_in_generate=True, output_scores=True, temperature=None, top_p=None,
                             top_k=None, **extra)
    sequences = []
    for row in out.sequences[:, ids.shape[1]:].tolist():
        sequences.append(row[: row.index(eos) + 1] if eos in row else row)
    assert [g for g, _ in CALLS] == list(range(groups)) * (len(CALLS) // groups)  # each step: group 0, 1, ...
    # the tokens each step's groups appended, in the beams' row order (steps 0 .. last-1; step 0's call sees the prompt)
    steps = [[t for _, tokens in CALLS[i : i + groups] for t in tokens] for i in range(groups, len(CALLS), groups)]
    return {"num_beams": beams, "num_beam_groups": groups, "diversity_penalty": penalty, "max_new_tokens": new,
            "settings": extra, "sequences": sequences, "scores": out.sequences_scores.tolist(),
            "beam_tokens": steps}


def tiny_cases() -> list[dict]:
    tiny = []
    for family, seed, prompt, pad_is_eos, case, *eos in TINY_CASES:
        lm = seeded_model(family, seed)
        ids = torch.tensor([TINY_PROMPTS[prompt]])
        with torch.no_grad():
            greedy = lm.generate(ids, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=PAD,
                                 temperature=None, top_p=None, top_k=None)[0, ids.shape[1]:].tolist()
        eos_id = eos[0] if eos else greedy[EOS_AT]
        pad = eos_id if pad_is_eos else PAD
        record = {"family": family, "seed": seed, "fingerprint": fingerprint(lm),
                  "prompt_ids": list(TINY_PROMPTS[prompt]), "eos": eos_id, "pad": pad,
                  **group_beam(lm, ids, eos_id, pad, case)}
        tiny.append(record)
        print(json.dumps(record), flush=True)
    return tiny


def main(folder: str, out: str, *flags: str) -> None:
    torch.manual_seed(0)
    watch_groups(CALLS)
    if "--tiny-only" in flags:  # keep the record's default-model cases, re-record the tiny ones
        result = json.loads(Path(out).read_text())
        result.update(command=" ".join(["python", *sys.argv]), tiny=tiny_cases())
        Path(out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
        return
    config = LlamaConfig.from_pretrained(folder)
    raw = json.loads((Path(folder) / "config.json").read_text())
    config.rope_theta = raw["rope_parameters"]["rope_theta"]
    model = LlamaForCausalLM.from_pretrained(folder, config=config, torch_dtype=torch.float32).eval()
    # 4.46 cannot read a 5.x tokenizer_config.json (class TokenizersBackend): the tokenizer.json itself
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(folder) / "tokenizer.json"), eos_token="<|im_end|>")
    eos = tokenizer.eos_token_id
    default = []
    for prompt, case in zip(DEFAULT_PROMPTS, DEFAULT_CASES, strict=True):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        record = {"prompt": prompt, "prompt_ids": ids[0].tolist(), "eos": eos, "pad": eos,
                  **group_beam(model, ids, eos, eos, case)}
        record["texts"] = [tokenizer.decode(s) for s in record["sequences"]]
        default.append(record)
        print(json.dumps(record, ensure_ascii=False), flush=True)
    result = {"source": "transformers.generation.utils GenerationMixin._group_beam_search (transformers 4.46)",
              "command": " ".join(["python", *sys.argv]),
              "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
              "model": Path(folder).name, "rope_theta": config.rope_theta, "chat": False,
              "default": default, "tiny": tiny_cases()}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
