"""The watermark's model work: scoring a text with the model's entropies (SWEET) and the edit budget; the green
lists, SynthID's g-values and the detectors are in ``playground.watermarking``."""
