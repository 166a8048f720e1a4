"""Contrastive search (Su et al. 2022): the model's k likeliest tokens, each run one step ahead in one batched pass,
ranked by confidence minus how much the token's last hidden state repeats the context's (``ranking`` for the
maths, ``decode`` for the loop)."""
