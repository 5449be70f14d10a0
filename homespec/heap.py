"""Keep Python's cyclic garbage collector off the request path.

A full collection walks every tracked object, and a loaded process has many: llama_cpp's
bindings, numpy, Jinja and the manifest in an engine; FastAPI, pydantic and Starlette in the
daemon. It took 13-15 ms on the machine here, and it runs when allocations trigger it, so
always inside some request (an engine makes its garbage while generating): a sixth of a short
answer's time, once every few requests.

`settle()` collects once and freezes what is alive (gc.freeze): those objects are out of the
collector's walks from then on, and later collections cost what the new objects cost (0.1-0.5 ms
here). Frozen objects are still freed by reference counting, and the models' memory by their
explicit close(). Call it where a pause is harmless: after loading, between requests.
"""

from __future__ import annotations

import gc


def settle() -> None:
    gc.collect()
    gc.freeze()
