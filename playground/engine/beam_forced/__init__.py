"""Constrained beam search (forced words): ``constraints`` (4.46's constraint states as values) and ``search``
(the step and the runner, beside ``playground.engine.beam``)."""
