"""XTC, exclude top choices (llama.cpp's): at random, remove the likeliest tokens but the least likely of them."""

from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler

register_sampler(SamplerSpec(
    name="xtc", position=150, reads=("xtc_probability", "xtc_threshold"), value_only=True, truncating=True,
    help="exclude top choices: sometimes remove the likeliest tokens but the least of them (--xtc-probability)",
    is_on=lambda s: s.xtc_probability > 0.0, needs_run="its draw comes from the run's generator",
    server=ServerWords(llama_word="xtc", llama=lambda s, sampling: dict(xtc_probability=s.xtc_probability,
                                                                        xtc_threshold=s.xtc_threshold),
                       llama_only="XTC"),
    what_if="exact when its probability is 1 and its cut is decided at both of the tail's bounds; else an "
            "estimate: XTC fires at random (shown as if it fired)",
    what_if_examples=(dict(xtc_probability=1.0, xtc_threshold=0.05),)))
