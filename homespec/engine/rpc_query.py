"""`python -m homespec.engine.rpc_query HOST:PORT`: ask an RPC worker for its devices and their
memory, and print them as JSON. Run in a throwaway process by `homespec.workers.probe`, because
llama.cpp aborts the process that connects to a worker that does not answer its handshake."""

from __future__ import annotations

# llama.cpp's library must load before numpy's (a CUDA build crashed at model load otherwise).
import homespec.engine.llama_backend as llama

# isort: split
import json
import sys


def main(argv: list[str]) -> int:
    (endpoint,) = argv
    devices = llama.ggml().add_worker(endpoint)
    print(json.dumps({"endpoint": endpoint, "devices": [d.to_dict() for d in devices]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
