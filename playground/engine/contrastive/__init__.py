"""Contrastive decoding: the expert's plausible tokens, ranked by how much more the expert likes them than an
amateur does (see ``scores`` for the maths, ``amateurs`` for who the amateur is, ``decode`` for the loop)."""
