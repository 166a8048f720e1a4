"""Locally typical sampling (Meister et al.; transformers' ``TypicalLogitsWarper``)."""

from playground.config.samplers.base import WHOLE_DISTRIBUTION, SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="typical_p", position=110, aliases=("typ_p", "typical"), reads=("typical_p",), value_only=True,
    truncating=True, help="keep the locally typical tokens (--typical-p)", is_on=lambda s: s.typical_p < 1.0,
    server=ServerWords(llama_word="typ_p", llama=lambda s, sampling: {"typical_p": s.typical_p},
                       llama_only="typical-p"), what_if=WHOLE_DISTRIBUTION,
    what_if_examples=(dict(typical_p=0.5), dict(typical_p=0.9))))
