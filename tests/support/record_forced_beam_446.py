"""Records transformers 4.46's constrained beam search (``generate(num_beams=N, force_words_ids=...)``, the
``ConstrainedBeamSearchScorer`` transformers shipped before moving it to the Hub) for
tests/test_forced_beam_reference.py, on the default model and on tiny models of the seven families of the
project's nine that 4.46 has. Run with the separate venv holding transformers 4.46 (see
tests/support/record_dola_446.py for how it was made):

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONPATH=.:tests /work/venv446/bin/python \\
        tests/support/record_forced_beam_446.py ~/.cache/decoding-playground/models/SmolLM2-135M-Instruct \\
        tests/data/forced_beam_4_46.json [--tiny-only]

(``--tiny-only`` keeps the file's default-model cases and re-records only the tiny models'.)

Forced words are tokenised as 4.46's docs do it, ``tokenizer(words, add_special_tokens=False).input_ids``, the
text as written (" cat" with its space); ``a|b`` is a disjunctive set (``force_words_ids`` entry
``[[ids of a], [ids of b]]``). No chat template; ``rope_theta`` set by hand for the 5.x config (4.46 would use
10,000). For each case it keeps the prompt ids, the forced ids and every returned sequence's generated ids (up to
and including the first EOS; 4.46 pads after it), best first, with their scores.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.generation.beam_search import BeamHypotheses

from support.forced_beam_cases import DEFAULT_CASES, TINY_CASES, TINY_FAMILIES, build_tiny, fingerprint
from support.tiny_models import build_tokenizer


def force_ids(tokenizer, words: tuple[str, ...]) -> list:
    out: list = []
    for word in words:
        alternatives = [tokenizer(text, add_special_tokens=False).input_ids for text in word.split("|")]
        out.append(alternatives if len(alternatives) > 1 else alternatives[0])
    return out


def record_case(model, tokenizer, prompt: str, words: tuple[str, ...], beams: int, tokens: int, returns: int
                ) -> dict:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    forced = force_ids(tokenizer, words)
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        out = model.generate(ids, num_beams=beams, force_words_ids=forced, max_new_tokens=tokens,
                             num_return_sequences=returns, do_sample=False, return_dict_in_generate=True,
                             output_scores=True, pad_token_id=model.generation_config.pad_token_id,
                             temperature=None, top_p=None, top_k=None)
    sequences = []
    for row, score in zip(out.sequences, out.sequences_scores, strict=True):
        generated = row[ids.shape[1]:].tolist()
        if eos in generated:
            generated = generated[: generated.index(eos) + 1]
        sequences.append({"ids": generated, "text": tokenizer.decode(generated), "score": float(score)})
    return {"prompt": prompt, "prompt_ids": ids[0].tolist(), "force_words": list(words), "force_words_ids": forced,
            "num_beams": beams, "max_new_tokens": tokens, "num_return_sequences": returns, "sequences": sequences}


def tiny_cases() -> dict:
    tiny_tokenizer = build_tokenizer()
    tiny = {}
    for family in TINY_FAMILIES:
        tiny_model = build_tiny(family, tiny_tokenizer)
        cases = [record_case(tiny_model, tiny_tokenizer, *case) for case in TINY_CASES]
        tiny[family] = {"fingerprint": fingerprint(tiny_model), "cases": cases}
        print(family, json.dumps(cases, ensure_ascii=False), flush=True)
    return tiny


def mend_fill_in_indices() -> None:
    """4.46's ``finalize`` fails ("Could not infer dtype of NoneType") when the returned hypotheses mix a finished one
    (with beam indices, as ``output_scores`` keeps them) and a filled-in one (added without): tiny Phi-3 meets it. A
    hypothesis added without indices gets an empty list; sequences and scores are untouched (indices are not kept)."""
    original = BeamHypotheses.add

    def add(self, hyp, sum_logprobs, beam_indices=None, generated_len=None):
        return original(self, hyp, sum_logprobs, [] if beam_indices is None else beam_indices, generated_len)

    BeamHypotheses.add = add


def main(folder: str, out: str, *flags: str) -> None:
    torch.manual_seed(0)
    mend_fill_in_indices()
    if "--tiny-only" in flags:  # keep the record's default-model cases, re-record the tiny ones
        record = json.loads(Path(out).read_text())
        record.update(command=" ".join(["python", *sys.argv]), tiny=tiny_cases())
        Path(out).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        return
    config = LlamaConfig.from_pretrained(folder)
    raw = json.loads((Path(folder) / "config.json").read_text())
    config.rope_theta = raw["rope_parameters"]["rope_theta"]
    model = LlamaForCausalLM.from_pretrained(folder, config=config, torch_dtype=torch.float32).eval()
    # 4.46 cannot read a 5.x tokenizer_config.json (class TokenizersBackend): the tokenizer.json itself
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(folder) / "tokenizer.json"), eos_token="<|im_end|>")
    default = []
    for case in DEFAULT_CASES:
        default.append(record_case(model, tokenizer, *case))
        print(json.dumps(default[-1], ensure_ascii=False), flush=True)
    record = {"source": "transformers.generation.utils GenerationMixin._constrained_beam_search with "
                        "ConstrainedBeamSearchScorer (transformers 4.46)",
              "command": " ".join(["python", *sys.argv]),
              "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
              "model": Path(folder).name, "rope_theta": config.rope_theta, "chat": False,
              "default": default, "tiny": tiny_cases()}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
