"""The engine: the only package that imports llama_cpp (in llama_backend.py)."""
