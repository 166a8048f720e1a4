"""Mirostat v2 (Basu et al.; llama.cpp's ``mirostat_v2``): mu, the surprise cut, follows the chosen tokens."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="mirostat", position=160, aliases=("mirostat_v2",), reads=("mirostat", "mirostat_tau", "mirostat_eta"),
    value_only=True, truncating=True,
    help="mirostat v2: drop tokens more surprising than mu, steering surprise to tau (--mirostat 2)",
    is_on=lambda s: s.mirostat == 2, needs_run="its mu follows the chosen tokens",
    server=ServerWords(llama=lambda s, sampling: dict(mirostat=2, mirostat_tau=s.mirostat_tau,
                                                      mirostat_eta=s.mirostat_eta), llama_only="mirostat"),
    what_if="exact when every earlier step is (mu is re-derived from the chosen tokens)",
    what_if_examples=(dict(mirostat=2, mirostat_tau=3.0, mirostat_eta=0.1),)))
