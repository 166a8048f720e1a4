"""Several runs on the same prompt, streaming together: the side-by-side panes (``panes``) and the figures measured
on each pane's output (``figures``)."""
