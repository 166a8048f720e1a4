"""``--quant METHOD``: any strategy run on the loaded model's quantized copy (``apply``), and the lab that runs the
reference beside it (``compare``, ``--compare``).

The copy comes from the variants' cache (``playground.engine.variants``, which builds it with the methods of
``playground.engine.quant``): so this package sits above both, and the quantization methods never import the
cache that uses them.
"""
